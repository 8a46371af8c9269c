"""EfficientNet-Lite0 (real weights, all 32 pointwise convs) under the FP8 quality options.

The slow tests are the evidence behind the README's options table and the issue's Lite0 targets:
500 calibration images of calib-1000, all of val-1300, on the CPU. They write their table as JSON
to $QUANTSTUDY_OPTIONS_OUT (default: the test's temporary folder) and print one line per
variant. The fast test checks the direction of the weight option on a subset.

Targets (issue 18): agreement with fp32 >= 97.5% (at most 32 of 1300 images differ) and KL mean
<= 0.010, for the fp32 emulation and the FP8 engine alike. Measured here (CPU, one thread):
compensating rounding with bias correction 50 images, KL 0.0132; with dynamic per-row
activation scales added 36 images, KL 0.0117. Both miss, so the target test is a strict
expected failure: it reports the day an option closes the gap.
"""

import os
from pathlib import Path

import pytest
import torch

from quantstudy.study.options import compare_options

MODEL, WEIGHTS = "tf_efficientnet_lite0", "efficientnet-lite0"
RECIPE = "generic_pointwise_compensated"
BEST = "compensating + bc + per-row scales"


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
def test_each_option_lowers_the_kl_mean(full_table):
    rows = {r["variant"]: r["fakequant"] for r in full_table["rows"]}
    assert full_table["n_heldout"] == 1300 and full_table["layers"] == 32
    assert rows["compensating + bias correction"]["kl_mean"] < rows["nearest"]["kl_mean"]
    assert rows[BEST]["kl_mean"] < rows["compensating + bias correction"]["kl_mean"]


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured 36 of 1300 differ, KL mean 0.0117 (issue 18)")
def test_lite0_targets_on_all_heldout_images(full_table):
    best = next(r for r in full_table["rows"] if r["variant"] == BEST)
    for engine in ("fakequant", "fp8"):
        r = best[engine]
        assert r["differ"] <= 32, (engine, r)
        assert r["kl_mean"] <= 0.010, (engine, r)
