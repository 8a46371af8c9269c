"""Residual sums that also write the next FP8 layer's input (`quant/rewrites/sum_handoff.py`), on
CPU."""

import pytest
import torch
from _interpreter import require_triton

from quantstudy.engines.builders import build_fp8
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.build_spec import BuildSpec
from tests.unit._interpreter import run_interpreted
from tests.unit.test_residual import _setup

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sum_read_by_the_next_fp8_layer_is_also_written_as_its_input(dtype):
    """conv3's sum is read by the next block's conv1 (and its identity shortcut), the second
    block's by the inverted residual's first conv: both sums are also written as that layer's
    FP8 input, across blocks (the stage is rewritten), and the engine's output stays bit-identical
    to the engine that adds and quantizes in separate passes. pwl's sum leaves the model: none.
    (Off by default, it made res2net slower on the H200: the default engine has sums, no copies.)"""
    model, x, plan = _setup()
    assert build_fp8(model, CPU, x, plan, dtype=dtype).info().layout.sum_handoff == {}
    fused = build_fp8(model, CPU, x, plan, dtype=dtype, spec=BuildSpec(sum_handoff=True))
    apart = build_fp8(model, CPU, x, plan, dtype=dtype, spec=BuildSpec(residual=False))
    assert fused.info().layout.sum_handoff == {
        "blocks.0.conv3": "blocks.1.conv1", "blocks.1.conv3": "blocks.2.pw",
    }  # fmt: skip
    conv3, conv1 = (fused.eager.get_submodule(n) for n in ("blocks.0.conv3", "blocks.1.conv1"))
    assert isinstance(conv3, FusedFP8Matmul) and conv3.pair_scale is not None
    assert torch.equal(conv3.pair_scale, conv1.x_scale) and conv1.fp8_input
    assert "and fp8 out" in repr(conv3) and "fp8 in" in repr(conv1)
    with torch.no_grad():
        got, want = fused.eager(fused.prepare(x)), apart.eager(apart.prepare(x))
    assert torch.equal(got, want)


def test_no_hand_off_to_a_reader_in_fp16_or_one_that_cannot_read_fp8():
    """The readers out of the plan (fp16): the sums stay in their layers, no FP8 copy."""
    model, x, plan = _setup()
    kept = [n for n in plan.layers if n not in ("blocks.1.conv1", "blocks.2.pw")]
    fewer = QuantPlan(kept, True, plan.calibration)
    info = build_fp8(
        model, CPU, x, fewer, dtype=torch.float32, spec=BuildSpec(sum_handoff=True)
    ).info()
    assert set(info.layout.residual) == {"blocks.0.conv3", "blocks.1.conv3", "blocks.2.pwl"}
    assert info.layout.sum_handoff == {}


def test_kernel_pair_under_the_interpreter_writes_the_fp8_copy_of_its_output():
    """The Triton epilogue's second store (pointer and descriptor store of the fp16 output):
    the fp16 output is the one the kernel writes without the copy, and the FP8 copy is what
    the kernel writes as its only, FP8 output (the hand-off path), bit for bit. (Against
    `to_fp8` the interpreter's own FP8 cast differs on about 1% of values; the GPU test checks
    the copy against `to_fp8` there.)"""
    require_triton()
    (same,) = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(4)
        m, k, n = 80, 32, 48
        xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(n, generator=g) / 7 + 0.01, torch.tensor(0.37)
        b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
        r = (torch.randn(m, n, generator=g) * 4).half()
        out_scale = torch.tensor(0.02)
        same = True
        for store in ("pointer", "tma"):
            args = (xq, w8, ws, xs, b, "relu", torch.float16, (32, 32, 32))
            kw = dict(store=store, round_to=torch.float16, residual=r, res_act="relu")
            alone = fp8_gemm_triton(*args, **kw)
            q = torch.empty(m, n, dtype=torch.float8_e4m3fn)
            y = fp8_gemm_triton(*args, **kw, out_scale=out_scale, pair=q)
            only = fp8_gemm_triton(*args[:6], torch.float8_e4m3fn, args[7], **kw,
                                   out_scale=out_scale)
            same &= torch.equal(y, alone)
            same &= torch.equal(q.view(torch.uint8), only.view(torch.uint8))
        print(int(same))
        """
    )
    assert same == "1"
