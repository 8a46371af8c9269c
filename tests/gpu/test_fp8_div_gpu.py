"""The FP8 write's division on the GPU (`quant/kernels/epilogue.py: scaled_down`): the scale's
reciprocal with one Markstein correction gives IEEE division's float32 quotient for every fp16
input, and its E4M3 byte for float32 ones, so the fused engines still write the unfused engine's
bits. `tools/lab/gpu/fp8_div_check.py` runs the same over 4,134 scales for the record."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from quantstudy.quant.kernels.epilogue import scaled_down  # noqa: E402 (needs Triton)


@triton.jit
def _compare(y_ptr, s_ptr, n, counts_ptr, BLOCK: tl.constexpr):
    """Program (block of y, one scale): both quotients, their float32 bits and E4M3 bytes."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    s = tl.load(s_ptr + tl.program_id(1))
    exact, fast = scaled_down(y, s, False), scaled_down(y, s, True)
    same = exact.to(tl.int32, bitcast=True) == fast.to(tl.int32, bitcast=True)
    same = same | ((exact != exact) & (fast != fast))
    q_exact = tl.minimum(tl.maximum(exact, -448.0), 448.0).to(tl.float8e4nv)
    q_fast = tl.minimum(tl.maximum(fast, -448.0), 448.0).to(tl.float8e4nv)
    byte = q_exact.to(tl.uint8, bitcast=True) == q_fast.to(tl.uint8, bitcast=True)
    tl.atomic_add(counts_ptr, tl.sum((~same & mask).to(tl.int64)))
    tl.atomic_add(counts_ptr + 1, tl.sum((~byte & mask).to(tl.int64)))


def _differences(y: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    """(float32 quotients, E4M3 bytes) that differ between the two divisions, over y x scales."""
    counts = torch.zeros(2, dtype=torch.int64, device="cuda")
    grid = (triton.cdiv(y.numel(), 1024), scales.numel())
    _compare[grid](y, scales, y.numel(), counts, BLOCK=1024)
    quotient, byte = counts.tolist()
    return quotient, byte


def test_the_corrected_reciprocal_divides_as_ieee_division():
    g = torch.Generator().manual_seed(1)
    scales = (10.0 ** torch.empty(64).uniform_(-9.0, 2.2, generator=g)).float()
    scales = torch.cat([scales, 2.0 ** torch.arange(-20, 8, dtype=torch.float32)]).cuda()
    halves = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    halves = halves[~torch.isnan(halves)].float().cuda()  # every fp16 value, the infinities too
    assert _differences(halves, scales) == (0, 0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64)
    floats = bits.to(torch.int32).view(torch.float32)
    floats = floats[torch.isfinite(floats)].cuda()
    assert _differences(floats, scales)[1] == 0  # the bytes; a few float32 quotients may differ
