"""`quantstudy bench` on CUDA: each GPU benchmark writes a valid, meaningful record whose checked
launches agree with torch, at small batches (seconds, not a measurement)."""

import pytest

from quantstudy.bench.report import render_folder
from quantstudy.bench.schema import read_record
from quantstudy.cli import main


def test_gemm_times_every_variant_of_lite0s_products(tmp_path):
    out = tmp_path / "gemm.json"
    assert main(["bench", "gemm", "tf_efficientnet_lite0", "--batch", "2", "--out", str(out)]) == 0
    record = read_record(out)
    assert record.meaningful and record.provenance.gpu_name and record.provenance.triton
    for row in record.results:
        assert {"fp16 mm", "scaled_mm", "autotuned", "autotuned pointer"} <= set(row.us)
        assert row.best_triton is not None and row.max_rel_error["autotuned"] < 2e-2
    assert "## FP8 products alone" in render_folder(tmp_path)


def test_depthwise_times_cudnn_against_the_triton_kernel(tmp_path):
    out = tmp_path / "dw.json"
    assert (
        main(["bench", "depthwise", "tf_efficientnet_lite0", "--batch", "2", "--out", str(out)])
        == 0
    )
    record = read_record(out)
    for row in record.results:
        assert set(row.us) == {"cudnn fp16", "triton fp16", "triton fp8 in", "triton fp8 in/out"}
        assert row.max_rel_error["triton fp16"] < 1e-2


@pytest.mark.data
@pytest.mark.shared("val-1300")
def test_speed_and_kernels_on_a_small_study(tmp_path, shared_data):
    common = ["tf_efficientnet_lite0", "--weights", "random", "--device", "cuda"]
    common += ["--data", str(shared_data / "val-1300"), "--calib", "32", "--heldout", "64"]
    speed = tmp_path / "speed.json"
    # one batch, the one `bench kernels` profiles below: the fused FP8 tiles are tuned once and
    # found in the tuning cache by the profile (each batch costs a tuning of every layer shape)
    args = ["bench", "speed", *common, "--batches", "8", "--rounds", "3", "--iters", "3"]
    assert main([*args, "--agreement", "--out", str(speed)]) == 0
    record = read_record(speed)
    assert record.meaningful and len(record.results[0].engines) == 2
    assert record.results[0].fused_vs_unfused.n_images == 64
    kernels = tmp_path / "kernels.json"
    args = ["bench", "kernels", *common, "--batch", "8", "--compiles", "1", "--sources", "1"]
    assert main([*args, "--out", str(kernels)]) == 0
    assert {"fp16", "fp8"} == set(read_record(kernels).compiles[0])
