"""Dynamic per-row activation scales taken in the fused kernel's prologue (QUANT_A,
`quant/kernels/gemm.py`) on CUDA: the same FP8 values as `quant.formats.fp8.quantize_rows` in torch,
so the same outputs as quantizing first and launching the kernel on FP8 rows."""

import pytest
import torch

from quantstudy.quant.formats.fp8 import quantize_rows
from quantstudy.quant.layers.spec import FP8LayerSpec

# tiles, conv_head's K 320.
SHAPES = [(128 * 3136, 24, 144), (196, 80, 480), (128 * 196, 192, 1152), (6272, 320, 1280)]


def _inputs(m: int, k: int, n: int):
    g = torch.Generator().manual_seed(m + k + n)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 8).half()
    x[1] = 0  # an all-zero row: scale 1
    d = 1 / (torch.rand(k, generator=g) + 0.5)  # a reciprocal divisor
    w8 = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    ws = torch.rand(n, generator=g) / 100 + 1e-3
    b = torch.randn(n, generator=g)
    return [t.cuda() for t in (x, d, w8, ws, b)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("divided", [False, True])
def test_prologue_quantize_computes_what_quantizing_first_computes(m, k, n, divided):
    """One tile and pointer loads for both launches: the quantized values are exact (the next
    test) and the sums run in the same order, so the outputs are the same bits."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    x, d, w8, ws, b = _inputs(m, k, n)
    div = d if divided else None
    q, s = quantize_rows(x, div)
    fixed = ((128, 64, 32, 4, 3), "pointer", "pointer")
    first = fp8_gemm_triton(q, w8, ws, s.contiguous(), b, "relu6", torch.float16, *fixed)
    here = fp8_gemm_triton(
        x, w8, ws, s.new_ones(()), b, "relu6", torch.float16, *fixed, x_inv_divisor=div
    )
    assert torch.equal(here, first), int((here != first).sum())


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_autotuned_prologue_quantize_computes_what_quantizing_first_computes(m, k, n):
    """Autotuned, the two launches may take different tiles, and every tile the prune keeps
    writes the same bits (docs/fp8-kernel.md, "Untimed passes"; test_gemm_tiles_gpu.py): the
    quantized values are exact (`test_prologue_quantized_values_are_exact`), so the tile each
    launch takes changes no output, bit for bit."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    x, _, w8, ws, b = _inputs(m, k, n)
    q, s = quantize_rows(x, None)
    first = fp8_gemm_triton(q, w8, ws, s.contiguous(), b, "relu6", torch.float16)
    here = fp8_gemm_triton(x, w8, ws, s.new_ones(()), b, "relu6", torch.float16)
    assert torch.equal(here, first), f"{int((here != first).sum())} differ"


@pytest.mark.parametrize(
    "tile,stream", [((128, 64, 32), 0), ((64, 128, 64), 0), ((128, 64, 32), 2)]
)
def test_prologue_quantized_values_are_exact(tile, stream):
    """With an identity weight each output is one quantized value times its row scale (float32
    out): every value equals `quantize_rows`' (ties, carries, subnormals included)."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    k = 32
    x, d, *_ = _inputs(4096, k, k)
    x[5, 7] = 3e4  # the rest of row 5 subnormal or zero
    eye = torch.eye(k, device="cuda").to(torch.float8_e4m3fn)
    ones = torch.ones(k, device="cuda")
    for div in (None, d):
        q, s = quantize_rows(x, div)
        y = fp8_gemm_triton(
            x,
            eye,
            ones,
            ones[0],
            None,
            "none",
            torch.float32,
            tile,
            stream=stream,
            x_inv_divisor=div,
        )
        assert torch.equal(y, q.float() * s), int((y != q.float() * s).sum())


def test_fused_layer_with_row_scales_and_divisor_matches_its_cpu_reference():
    """A K-padded layer (K 24) with migration and per-row scales: the GPU path quantizes the
    unpadded fp16 rows in the kernel; the CPU path (float32 engine) in torch."""
    from torch import nn

    from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul

    torch.manual_seed(0)
    conv = nn.Conv2d(24, 144, 1)
    x = torch.randn(8, 24, 14, 14).half().float()
    d = torch.rand(24) + 0.5
    ref = FusedFP8Matmul(
        conv, FP8LayerSpec(1.0, True, torch.float32, "relu6", row_scales=True, x_divisor=d)
    )
    gpu = FusedFP8Matmul(
        conv, FP8LayerSpec(1.0, True, torch.float16, "relu6", row_scales=True, x_divisor=d)
    )
    gpu = gpu.cuda()
    with torch.no_grad():
        want = ref(x)
        got = gpu(x.cuda().half().contiguous(memory_format=torch.channels_last)).float().cpu()
    assert gpu.k_pad == 8
    # the fp16 division by the divisor and one fp16 rounding of the output separate them
    assert torch.allclose(got, want, rtol=5e-2, atol=5e-2), (got - want).abs().max()
