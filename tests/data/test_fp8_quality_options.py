"""EfficientNet-Lite0 (real weights, all 32 pointwise convs) under the FP8 quality options.

The `evidence` tests re-measure the README's options table on the CPU: 500 calibration images of
calib-1000, all of val-1300 (not timed; a 100-image propagated fit took 4 minutes on 2 cores, so
about half an hour, the fit most of it; not in CI).
They write their table as JSON to $QUANTSTUDY_OPTIONS_OUT (default: the test's temporary folder)
and print one line per variant. The `slow` test checks the direction of the weight option on a
subset (in CI).

Targets (issue 18): agreement with fp32 >= 97.5% (at most 32 of 1300 images differ) and KL mean
<= 0.010, for the fp32 emulation and the FP8 engine alike. The built-in recipe's options
(`generic_pointwise_propagated`: the propagated fit, compensating rounding with 16 scale
candidates and 4 refinement sweeps, headroom 4; no migration) as measured on a 2-core CPU and on
the GPU are in docs/results/figures/fp8-options-lite0.json (rendered in docs/fp8-options.md): on the
CPU the emulation met both targets with its count at the line, and the CPU FP8 engine, which
computes in bf16 where the GPU engine computes in fp16, missed both. So the emulation tests assert
the targets, and the CPU engine's test is a strict expected failure that names what it measured.
Those figures were measured with calibration images taken as the first 500 of calib-1000; the
table now takes the study's class-balanced split (`quantstudy bench options`, which prepares
as a study does), so a count at the line may move by an image or two until re-measured.
"""

import os
from pathlib import Path

import pytest
import torch

from quantstudy.bench.options.compare import compare_options
from quantstudy.record import StudyConfig

pytestmark = pytest.mark.shared("val-1300", "calib-1000")
MODEL, WEIGHTS = "tf_efficientnet_lite0", "efficientnet-lite0"
RECIPE = "generic_pointwise_compensated"
BEST = "propagated compensating + bias correction + scale search + refinement + headroom 4"


def _config(shared_data: Path, calib: int, heldout: int) -> StudyConfig:
    """The study config of the table: Lite0's real weights, calibration from calib-1000."""
    return StudyConfig(
        model=MODEL, weights=WEIGHTS, data=shared_data / "val-1300",
        calib_data=shared_data / "calib-1000", calib=calib, heldout=heldout, recipe=RECIPE,
        device="cpu",
    )  # fmt: skip


def _out(tmp_path: Path, name: str) -> Path:
    folder = os.environ.get("QUANTSTUDY_OPTIONS_OUT")
    return Path(folder) / name if folder else tmp_path / name


@pytest.mark.data
@pytest.mark.slow  # two calibrations with second moments and emulations: a minute on 2 cores
def test_compensating_rounding_beats_nearest_on_a_subset(shared_data, tmp_path):
    torch.set_num_threads(2)
    result = compare_options(
        _config(shared_data, calib=100, heldout=200),
        ["nearest + bias correction", "compensating + bias correction"],
    )
    near, comp = (r["fakequant"] for r in result["rows"])
    print(near, comp, sep="\n")
    assert result["layers"] == 32
    assert comp["kl_mean"] < near["kl_mean"]


@pytest.fixture(scope="module")
def full_table(shared_data, tmp_path_factory):
    torch.set_num_threads(2)
    out = _out(tmp_path_factory.mktemp("options"), "options-cpu.json")
    return compare_options(
        _config(shared_data, calib=500, heldout=1300),
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
    raises=AssertionError,
    reason="the CPU FP8 engine computes in bf16: 33 images, KL 0.0099 measured (the H200's fp16 "
    "engine: 37 / 0.0092 and 35 / 0.0094; issue 18)",
)
def test_lite0_cpu_engine_meets_both_targets_on_all_heldout_images(full_table):
    engine = _best(full_table)["fp8"]
    assert engine["differ"] <= 32 and engine["kl_mean"] <= 0.010, engine
