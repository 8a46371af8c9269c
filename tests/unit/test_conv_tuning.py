"""`bench/conv_tuning.py`, the CPU side of tools/lab/gpu/conv_tuning_check.py: the conv shapes it
launches are the ones the engine runs (resnet50's dense kxk convs, Lite0's depthwise convs with
TensorFlow "same" padding), and a warm run whose bits differ from the cold one, or a failed cold
check, fails the check. Its launches need a GPU (tools/device/README.md)."""

import copy

from quantstudy.bench.conv_tuning import compare_phases, model_convs


def test_it_finds_each_distinct_conv_the_engine_runs():
    resnet = model_convs("resnet50")
    assert [c.kernel for c in resnet] == [(7, 7)] + [(3, 3)] * 7
    assert not any(c.depthwise for c in resnet)
    assert resnet[0].cin == 16 and resnet[0].out == (112, 112)  # 3 channels padded to 16
    assert [(c.cin, c.stride[0], c.out[0]) for c in resnet[1:]] == [
        (64, 1, 56), (128, 2, 28), (128, 1, 28), (256, 2, 14), (256, 1, 14), (512, 2, 7),
        (512, 1, 7),
    ]  # fmt: skip
    lite0 = model_convs("tf_efficientnet_lite0")
    depthwise = [c for c in lite0 if c.depthwise]
    assert len(depthwise) == 12 and len(lite0) == 13  # and the 3x3 stem
    strided = next(c for c in depthwise if c.cin == 96)
    assert strided.stride == (2, 2) and strided.pad == (0, 0)  # "same": the odd pixel at the end


def _run(digest: str) -> dict:
    tuning = {"fp8_conv2d": {"launches": 2, "configs": 7, "compile_s": 1.0, "tune_s": 0.5}}
    return {"layers": 2, "first_pass_s": 1.5, "tuning": tuning, "digests": [digest]}


def test_a_warm_run_of_other_bits_or_a_failed_cold_check_fails_it(capsys):
    checks = {"untimed_equal": True, "every_kept_tile_equal": True, "stored_equal": True}
    cold = {"resnet50 batch 1": {**_run("a"), "untimed_pass_s": 0.5, **checks}}
    phases = {"cold": {"runs": cold}, "warm": {"runs": {"resnet50 batch 1": _run("a")}}}
    assert compare_phases(copy.deepcopy(phases))
    assert "resnet50 cold: 2 launches, 7 configs compiled, 2.0 s" in capsys.readouterr().out
    other = copy.deepcopy(phases)
    other["warm"]["runs"]["resnet50 batch 1"]["digests"] = ["b"]
    assert not compare_phases(other)
    failed = copy.deepcopy(phases)
    failed["cold"]["runs"]["resnet50 batch 1"]["every_kept_tile_equal"] = False
    assert not compare_phases(failed)
