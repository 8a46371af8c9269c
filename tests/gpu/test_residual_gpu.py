"""Residual sums in the fused FP8 kernel's epilogue on CUDA (`quant/rewrites/residual.py`)."""

import pytest
import torch

from quantstudy.engines.builders import build_fp8
from quantstudy.record.build_spec import BuildSpec
from tests.unit.test_residual import _setup


@pytest.mark.parametrize("res_act", ["none", "relu"])
@pytest.mark.parametrize("tile", [None, (128, 64, 64)])
def test_the_epilogue_sum_writes_what_the_separate_add_writes(res_act, tile):
    """The kernel with the residual (channels-last rows of an NCHW tensor, as the engine hands
    it) writes the same fp16 bits as the kernel without it followed by the add (and ReLU) in
    fp16 torch: both round the layer's value and the sum to fp16. `tile` None: the autotuner's
    choice (descriptor stores allowed)."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    g = torch.Generator().manual_seed(7)
    b, h, w, k, n = 16, 28, 28, 104, 256
    m = b * h * w
    xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    ws = (torch.rand(n, generator=g) / 50 + 1e-3).cuda()
    xs, bias = torch.tensor(0.05).cuda(), torch.randn(n, generator=g).cuda()
    nchw = torch.randn(b, n, h, w, generator=g).half().cuda()
    r = nchw.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(m, n)
    args = (xq, w8, ws, xs, bias, "relu6", torch.float16, tile)
    alone = fp8_gemm_triton(*args, round_to=torch.float16)
    want = alone + r
    want = want.clamp_min(0) if res_act == "relu" else want
    got = fp8_gemm_triton(*args, round_to=torch.float16, residual=r, res_act=res_act)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()


def test_residual_engine_equals_the_separate_add_engine_eagerly():
    """Eager fused engines (the Triton kernels, fp16) with and without the sums in their
    epilogue: the same bits, as both round where the other stores."""
    model, x, plan = _setup()
    cuda = torch.device("cuda")
    on = build_fp8(model, cuda, x, plan)
    off = build_fp8(model, cuda, x, plan, spec=BuildSpec(residual=False))
    assert len(on.info().layout.residual) == 3 and off.info().layout.residual == {}
    xs = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = on.eager(on.prepare(xs)), off.eager(off.prepare(xs))
    assert torch.equal(a, b)


def test_the_pair_writes_the_fp8_copy_of_its_own_output():
    """The second store of a sum that is also the next layer's input
    (`quant/rewrites/sum_handoff.py`): the fp16 output is the kernel's without the copy, the copy is
    `to_fp8` of it bit for bit."""
    from quantstudy.quant.formats.fp8 import to_fp8
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    g = torch.Generator().manual_seed(8)
    m, k, n = 16 * 28 * 28, 104, 256
    xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    ws = (torch.rand(n, generator=g) / 50 + 1e-3).cuda()
    xs, bias = torch.tensor(0.05).cuda(), torch.randn(n, generator=g).cuda()
    r = (torch.randn(m, n, generator=g) * 2).half().cuda()
    out_scale = torch.tensor(0.01).cuda()
    args = (xq, w8, ws, xs, bias, "none", torch.float16)
    kw = {"round_to": torch.float16, "residual": r, "res_act": "relu"}
    alone = fp8_gemm_triton(*args, **kw)
    q = torch.empty(m, n, dtype=torch.float8_e4m3fn, device="cuda")
    y = fp8_gemm_triton(*args, **kw, out_scale=out_scale, pair=q)
    assert torch.equal(y, alone)
    assert torch.equal(q.view(torch.uint8), to_fp8(y.float(), out_scale).view(torch.uint8))


def test_sum_handoff_engine_equals_the_separate_passes_eagerly():
    """Eager fused engines (Triton kernels, fp16) whose sums also write the next layer's FP8
    input, against the engine with adds and quantizes apart: the same bits."""
    model, x, plan = _setup()
    cuda = torch.device("cuda")
    on = build_fp8(model, cuda, x, plan, spec=BuildSpec(sum_handoff=True))
    off = build_fp8(model, cuda, x, plan, spec=BuildSpec(residual=False))
    assert len(on.info().layout.sum_handoff) == 2
    xs = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(on.eager(on.prepare(xs)), off.eager(off.prepare(xs)))
