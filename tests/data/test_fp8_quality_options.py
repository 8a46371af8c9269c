"""EfficientNet-Lite0 (real weights, all 32 pointwise convs) under the FP8 quality options.

The slow test is the evidence behind the README's options table and the Lite0 targets: 500
calibration images of calib-1000, all of val-1300, the CPU (fp32 emulation, and the FP8 engine
in fp32 compute with the fused kernel's arithmetic). It writes its table as JSON to
$QUANTSTUDY_OPTIONS_OUT (default: the test's temporary folder) and prints one line per variant.
The fast test checks the direction of the weight option on a subset.

Targets (issue 18), for the recipe `generic_pointwise_compensated` (compensating rounding with
bias correction): agreement with fp32 >= 97.5% (at most 32 of 1300 differ), KL mean <= 0.010.
"""

import os
from pathlib import Path

import pytest
import torch

from quantstudy.study.options import compare_options

MODEL, WEIGHTS = "tf_efficientnet_lite0", "efficientnet-lite0"
RECIPE = "generic_pointwise_compensated"


@pytest.mark.data
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


@pytest.mark.data
@pytest.mark.slow
def test_lite0_targets_on_all_heldout_images(shared_data, tmp_path):
    torch.set_num_threads(2)
    out = Path(os.environ.get("QUANTSTUDY_OPTIONS_OUT", tmp_path / "options.json"))
    result = compare_options(
        MODEL, WEIGHTS, shared_data / "val-1300", shared_data / "calib-1000", 500, RECIPE,
        engine_variants=["compensating + bias correction"], out=out,
    )  # fmt: skip
    rows = {r["variant"]: r for r in result["rows"]}
    assert result["n_heldout"] == 1300 and result["layers"] == 32
    chosen = rows["compensating + bias correction"]
    for engine in ("fakequant", "fp8"):
        r = chosen[engine]
        assert r["differ"] <= 32, (engine, r)
        assert r["kl_mean"] <= 0.010, (engine, r)
    near = rows["nearest"]["fakequant"]
    assert chosen["fakequant"]["kl_mean"] < near["kl_mean"]
