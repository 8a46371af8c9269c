"""FP8 E4M3 arithmetic shared by the real engine and its emulation.

Both paths call these functions, so the FP8 engine and the fake-quant model quantize at the same
points with the same rounding: divide by the scale in float32, saturate to +-448, round to nearest
even by the cast to `torch.float8_e4m3fn`.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


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
    """Dynamic scale of each row of `x` (max |x| along `dim`, kept as size 1) / 448, float32;
    an all-zero row gets scale 1 (it quantizes to zero whatever the scale)."""
    scale = x.detach().float().abs().amax(dim=dim, keepdim=True) / E4M3_MAX
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_rows(
    x: torch.Tensor, divisor: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rows of `x` (rows, K) with dynamic per-row scales ((rows, 1)), after dividing by a
    per-column `divisor` in x's dtype (scale migration): what the fused kernel computes in its
    prologue (`quant/triton_fp8.py`, QUANT_A)."""
    if divisor is not None:
        x = x / divisor.to(x.dtype)
    scale = row_scale(x)
    return to_fp8(x, scale), scale


def fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize then dequantize, returning x's dtype: the emulation of one FP8 tensor."""
    return (to_fp8(x, scale).float() * scale).to(x.dtype)


def dequantize_weight(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float weight from its FP8 form and scale (per channel or per tensor)."""
    view = scale.reshape(-1, *([1] * (w8.dim() - 1))) if scale.dim() == 1 else scale
    return (w8.float() * view).to(dtype)
