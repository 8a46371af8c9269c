"""The per-row quantizing prologue of the FP8 kernels (QUANT_A): an unquantized input's tile
divided by the migration divisor, each row's max |x| and scale, the tile rounded to E4M3 on
it. The Triton twins of `quant.formats.fp8.quantize_rows`, held to it by the tests.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantstudy.quant.formats import fp8

E4M3_INV = tl.constexpr(fp8.E4M3_INV)  # per-row scales are max |x| times it (`row_scales`)


@triton.jit
def a_tile(a_ptrs, mask, d_ptrs, k_mask, HAS_DIV: tl.constexpr):
    """One tile of an unquantized input (QUANT_A) times the reciprocal of the migration
    divisor (`d_ptrs`, float32), rounded back to the input's dtype
    (`quant.formats.fp8.quantize_rows`)."""
    a = tl.load(a_ptrs, mask=mask, other=0.0)
    if HAS_DIV:
        d = tl.load(d_ptrs, mask=k_mask, other=1.0)
        a = (a.to(tl.float32) * d[None, :]).to(a.dtype, fp_downcast_rounding="rtne")
    return a


@triton.jit
def row_amax(a, amax):
    """The running max |a| of each row."""
    return tl.maximum(amax, tl.max(tl.abs(a.to(tl.float32)), axis=1))


@triton.jit
def row_scales(amax):
    """`quant.formats.fp8.row_scale`: max |row| x float32(1/448), 1 for an all-zero row."""
    rows = amax * E4M3_INV
    return tl.where(rows > 0.0, rows, 1.0)


@triton.jit
def to_e4m3(a, inv_rows):
    """`quant.formats.fp8.to_fp8_rows` of a tile: times each row's reciprocal scale, saturate at
    +-448, round to nearest even."""
    q = a.to(tl.float32) * inv_rows[:, None]
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    return q.to(tl.float8e4nv, fp_downcast_rounding="rtne")
