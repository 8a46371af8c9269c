"""FP8 E4M3 arithmetic shared by the real engine and its emulation.

Both paths call these functions, so the FP8 engine and the fake-quant model quantize at the same
points with the same rounding: divide by the scale in float32, saturate to +-448, round to nearest
even by the cast to `torch.float8_e4m3fn`.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# 1/448 rounded to float32. Per-row scales are max |x| times it: torch on CUDA divides by a
# scalar that way (a product with its reciprocal), on the CPU it divides, so a product is
# what CPU, GPU and the fused kernel's prologue (`quant/kernels/gemm.py`) compute alike.
E4M3_INV = float(torch.tensor(1 / E4M3_MAX, dtype=torch.float32))


def weight_scale(weight: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """Scale amax/448 of a weight, per output channel (shape [out]) or per tensor (scalar).

    An all-zero channel gets scale 1 (its values quantize to zero whatever the scale).
    """
    w = weight.detach().float()
    if per_channel:
        amax = w.abs().reshape(w.shape[0], -1).amax(dim=1)
    else:
        amax = w.abs().amax()
    scale = amax / E4M3_MAX
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize: x / scale in float32, saturate at +-448, cast (round to nearest even)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_weight(weight: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 weight and its float32 scale (per channel: shape [out]; per tensor: scalar)."""
    scale = weight_scale(weight, per_channel)
    view = scale.reshape(-1, *([1] * (weight.dim() - 1))) if per_channel else scale
    return to_fp8(weight, view), scale


def row_scale(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Dynamic scale of each row of `x` (max |x| along `dim`, kept as size 1) x `E4M3_INV`,
    float32; an all-zero row gets scale 1 (it quantizes to zero whatever the scale)."""
    scale = x.detach().float().abs().amax(dim=dim, keepdim=True) * E4M3_INV
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def to_fp8_rows(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize with one scale per row (`row_scale`): x times the scale's reciprocal in
    float32 (one division per row, not per value, in the fused kernel too), saturate, cast."""
    return (x.float() * torch.reciprocal(scale)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_rows(
    x: torch.Tensor, inv_divisor: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rows of `x` (rows, K) and their dynamic scales ((rows, 1)), after multiplying by
    the per-column reciprocal of a migration divisor (float32, the product rounded to x's
    dtype): what the fused kernel computes in its prologue (`quant/kernels/gemm.py`, QUANT_A)."""
    if inv_divisor is not None:
        x = (x.float() * inv_divisor).to(x.dtype)
    scale = row_scale(x)
    return to_fp8_rows(x, scale), scale


def fake_quant_rows(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`fake_quant` with one dynamic scale per row along `dim` (`row_scale`, `to_fp8_rows`)."""
    scale = row_scale(x, dim)
    return (to_fp8_rows(x, scale).float() * scale).to(x.dtype)


def fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize then dequantize, returning x's dtype: the emulation of one FP8 tensor."""
    return (to_fp8(x, scale).float() * scale).to(x.dtype)


def dequantize_weight(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float weight from its FP8 form and scale (per channel or per tensor)."""
    view = scale.reshape(-1, *([1] * (w8.dim() - 1))) if scale.dim() == 1 else scale
    return (w8.float() * view).to(dtype)
