"""EfficientNet-Lite0 (real weights, all 32 pointwise convs) under the FP8 quality options.

The `evidence` tests re-measure the README's options table on the CPU: 500 calibration images of
calib-1000, all of val-1300 (not timed; a 100-image sequential fit took 4 minutes on 2 cores, so
about half an hour, the fit most of it; not in CI).
They write their table as JSON to $QUANTSTUDY_OPTIONS_OUT (default: the test's temporary folder)
and print one line per variant. The `slow` test checks the direction of the weight option on a
subset (in CI).

Targets (issue 18): agreement with fp32 >= 97.5% (at most 32 of 1300 images differ) and KL mean
<= 0.010, for the fp32 emulation and the FP8 engine alike. The built-in recipe's options
(`generic_pointwise_sequential`: the sequential fit, compensating rounding with 16 scale
candidates and 4 refinement sweeps, headroom 4; no migration) measured on this
repository's 2-core CPU (examples/lite0-fp8-options/options-cpu-no-migration.json, the options
module on this variant alone, 18 minutes): the emulation 32 images, KL 0.0093, both targets met
(the count at the line); the CPU FP8 engine, which computes in bf16 where the GPU engine computes
in fp16, 33 images and KL 0.0099. On the H200 the fp16 engine gave 37 / 0.0092 and 35 / 0.0094
(examples/lite0-fp8-options). So the emulation tests assert the targets, and the CPU engine's
test is a strict expected failure that names what it measured.
"""

import os
from pathlib import Path

import pytest
import torch

from quantstudy.study.options import compare_options

pytestmark = pytest.mark.shared("val-1300", "calib-1000")
MODEL, WEIGHTS = "tf_efficientnet_lite0", "efficientnet-lite0"
RECIPE = "generic_pointwise_compensated"
BEST = "sequential compensating + bias correction + scale search + refinement + headroom 4"


def _out(tmp_path: Path, name: str) -> Path:
    folder = os.environ.get("QUANTSTUDY_OPTIONS_OUT")
    return Path(folder) / name if folder else tmp_path / name


@pytest.mark.data
@pytest.mark.slow  # two calibrations with second moments and emulations: a minute on 2 cores
def test_compensating_rounding_beats_nearest_on_a_subset(shared_data, tmp_path):
    torch.set_num_threads(2)
    result = compare_options(
        MODEL, WEIGHTS, shared_data / "val-1300", shared_data / "calib-1000", 100, RECIPE,
        ["nearest + bias correction", "compensating + bias correction"], max_heldout=200,
    )  # fmt: skip
    near, comp = (r["fakequant"] for r in result["rows"])
    print(near, comp, sep="\n")
    assert result["layers"] == 32
    assert comp["kl_mean"] < near["kl_mean"]


@pytest.fixture(scope="module")
def full_table(shared_data, tmp_path_factory):
    torch.set_num_threads(2)
    out = _out(tmp_path_factory.mktemp("options"), "options-cpu.json")
    return compare_options(
        MODEL, WEIGHTS, shared_data / "val-1300", shared_data / "calib-1000", 500, RECIPE,
        ["nearest", "compensating + bias correction", BEST], engine_variants=[BEST], out=out,
    )  # fmt: skip


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.evidence
def test_each_option_lowers_the_kl_mean(full_table):
    rows = {r["variant"]: r["fakequant"] for r in full_table["rows"]}
    assert full_table["n_heldout"] == 1300 and full_table["layers"] == 32
    assert rows["compensating + bias correction"]["kl_mean"] < rows["nearest"]["kl_mean"]
    assert rows[BEST]["kl_mean"] < rows["compensating + bias correction"]["kl_mean"]


def _best(full_table) -> dict:
    return next(r for r in full_table["rows"] if r["variant"] == BEST)


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.evidence
def test_lite0_emulation_meets_both_targets_on_all_heldout_images(full_table):
    emulation = _best(full_table)["fakequant"]
    assert emulation["differ"] <= 32, emulation
    assert emulation["kl_mean"] <= 0.010, emulation


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.evidence
@pytest.mark.xfail(
    strict=True,
    reason="the CPU FP8 engine computes in bf16: 33 images, KL 0.0099 measured (the H200's fp16 "
    "engine: 37 / 0.0092 and 35 / 0.0094; issue 18)",
)
def test_lite0_cpu_engine_meets_both_targets_on_all_heldout_images(full_table):
    engine = _best(full_table)["fp8"]
    assert engine["differ"] <= 32 and engine["kl_mean"] <= 0.010, engine
