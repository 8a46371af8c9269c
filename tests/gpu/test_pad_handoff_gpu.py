"""Fused FP8 layers writing the next conv's zero padding on CUDA
(`quant/rewrites/pad_handoff.py`)."""

import pytest
import torch

from quantstudy.engines.builders import build_fp8
from quantstudy.record.build_spec import BuildSpec
from tests.unit.test_pad_handoff import _setup


@pytest.mark.parametrize("tile", [None, (128, 64, 64)])
def test_the_mapped_store_writes_the_plain_output_inside_the_padding(tile):
    """The kernel writing the interior of a padded buffer (the autotuner's choice, or a fixed
    tile) stores the bits of its plain (M, N) output at each pixel and nothing else."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    g = torch.Generator().manual_seed(9)
    b, h, w, k, n = 16, 56, 56, 24, 144
    m = b * h * w
    xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn).cuda()
    ws = (torch.rand(n, generator=g) / 50 + 1e-3).cuda()
    xs, bias = torch.tensor(0.05).cuda(), torch.randn(n, generator=g).cuda()
    args = (xq, w8, ws, xs, bias, "relu6", torch.float16, tile)
    plain = fp8_gemm_triton(*args, round_to=torch.float16)
    buf = torch.full((b, h + 1, w + 1, n), 7.0, dtype=torch.float16, device="cuda")
    fp8_gemm_triton(*args, round_to=torch.float16, out=buf[:, :h, :w])
    assert torch.equal(buf[:, :h, :w].reshape(m, n), plain)
    assert bool((buf[:, h:] == 7.0).all()) and bool((buf[:, :, w:] == 7.0).all())


@pytest.mark.parametrize("compiled", [False, True])
def test_padded_engine_equals_the_engine_with_padding_passes(compiled):
    """Fused engines (Triton kernels, fp16) with and without the padded outputs: eagerly the
    same bits, as the conv reads the same padded tensor either way; compiled, the same to
    fp16 rounding (the padded op's fake tensor matches what it returns)."""
    model, x, plan = _setup(16, 16)
    cuda = torch.device("cuda")
    on = build_fp8(model, cuda, x, plan)
    off = build_fp8(model, cuda, x, plan, spec=BuildSpec(pad_outputs=False))
    assert on.info().layout.padded_output == {"pw": "dw", "pwl": "pad"}
    xs = torch.randn(8, 16, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if compiled:  # Inductor fuses the two graphs' passes differently: fp16 tolerance
            torch.testing.assert_close(on(xs), off(xs), rtol=2e-3, atol=2e-3)
            return
        a, b = on.eager(on.prepare(xs)), off.eager(off.prepare(xs))
    assert torch.equal(a, b), (a.float() - b.float()).abs().max()


def test_float32_engine_computes_its_emulation_up_to_summation_order():
    """The fused FP8 engine built in float32 on CUDA (the Triton kernels with no half-precision
    rounding, padded outputs included) against the recipe's fp32 emulation, TF32 off as in a
    study: the same FP8 values and sums in another order, where an FP8 rounding the order flips
    moves its descendants by one FP8 step. So the engine stays far closer to the emulation than
    the emulation is to fp32 (a wrong scale or rounding would not). On the CPU this engine sat at
    the reassociation floor on Lite0 (14 images against 13; docs/results/figures/
    fp8-options-lite0.json, `options-cpu-engine-float32`)."""
    from quantstudy.engines.builders import build_fakequant, build_fp32, set_numerics

    set_numerics()
    model, x, plan = _setup(16, 16)
    cuda = torch.device("cuda")
    fp8 = build_fp8(model, cuda, x, plan, dtype=torch.float32)
    emu, ref = build_fakequant(model, cuda, x, plan), build_fp32(model, cuda)
    assert fp8.info().compute_dtype == "float32" and fp8.info().layout.padded_output
    xs = torch.randn(8, 16, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b, r = fp8.eager(fp8.prepare(xs)).float().cpu(), emu(xs), ref(xs)
    engine_gap, quant_error = (a - b).abs().max(), (b - r).abs().max()
    print(f"engine vs emulation {engine_gap:.3g}, emulation vs fp32 {quant_error:.3g}")
    assert engine_gap < 0.5 * quant_error
