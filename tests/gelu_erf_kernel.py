"""A Triton kernel that runs the FP8 epilogue's GELU and FP8 write on a flat tensor: the jit
functions every FP8 kernel's epilogue calls (`quant/kernels/epilogue.py: activation, fp8_range`),
on inputs a test chooses instead of a product's sums. Used under the interpreter
(`tests/unit/test_gelu_erf.py`) and compiled (`tests/gpu/test_gelu_erf_gpu.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantstudy.quant.kernels.epilogue import activation, fp8_range

BLOCK = 1 << 16


@triton.jit
def _gelu_write(x_ptr, y_ptr, out_scale_ptr, n, ACT: tl.constexpr, FP8_OUT: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = fp8_range(activation(tl.load(x_ptr + offs, mask=mask, other=0.0), ACT), out_scale_ptr)
    if FP8_OUT:
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(y_ptr + offs, y, mask=mask)


def gelu_write(x: torch.Tensor, out_scale: float, act: int, out_dtype: torch.dtype) -> torch.Tensor:
    """The epilogue's activation `act` (a kernel code) on float32 `x`, divided by `out_scale` and
    saturated; stored as E4M3 (`out_dtype` float8_e4m3fn, the GPU's store rounding) or as the
    float32 values the store would round (float32: the interpreter's E4M3 cast is wrong)."""
    x = x.float().contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    scale = torch.tensor(out_scale, device=x.device, dtype=torch.float32)
    fp8 = out_dtype == torch.float8_e4m3fn
    _gelu_write[(triton.cdiv(x.numel(), BLOCK),)](x, y, scale, x.numel(), act, fp8, BLOCK)
    return y
