"""The zero border of a padded channels-last buffer, written by one Triton kernel.

A 1x1 FP8 conv that feeds a padded conv writes its output into the interior of the zero-padded
buffer the next conv reads (`quant/rewrites/pad_handoff.py`); only the border needs zeros. One
launch writes them, and nothing else: a program per buffer row, the whole row where it lies
above or below the interior, else the `left` and `right` pixels at its two ends. It mutates
the buffer itself, no view of it, so a package's tracer has no view to copy and scatter back
(`quant/layers/fused_matmul.py: fp8_gemm_padded`).

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from quantstudy.quant.kernels import launches
from quantstudy.quant.kernels.epilogue import loop_bound

BLOCK = 1024  # elements per store in a row's loop


@triton.jit
def _zero_border_kernel(
    buf_ptr, HP, row_len, C, top, h, left, w, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # b * HP + r over the (B, HP, WP, C) buffer, row_len = WP * C
    r = row % HP
    base = buf_ptr + row.to(tl.int64) * row_len
    inside = (r >= top) & (r < top + h)
    head = tl.where(inside, left * C, row_len)  # zeros in [0, head) and [tail, row_len)
    tail = tl.where(inside, (left + w) * C, row_len)
    zero = tl.zeros((BLOCK,), dtype=buf_ptr.dtype.element_ty)
    # runtime bounds through `loop_bound`: Triton 3.6's interpreter holds them as 1-element arrays
    for start in range(0, loop_bound(head), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(base + offs, zero, mask=offs < head)
    for start in range(loop_bound(tail), loop_bound(row_len), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(base + offs, zero, mask=offs < row_len)


def zero_border(buf: torch.Tensor, size: Sequence[int], pads: Sequence[int]) -> torch.Tensor:
    """Zero the border of `buf`, a dense (B, H + top + bottom, W + left + right, C) buffer
    around its (B, H, W, C) interior; `size` (B, H, W), `pads` (left, right, top, bottom) as
    `F.pad` takes them. The interior is not touched. Traced into a package, the kernel goes
    through torch's `wrap_triton` (`launches.launchable`)."""
    b, h, w = size
    left, right, top, bottom = pads
    if buf.dim() != 4 or not buf.is_contiguous():
        raise ValueError("zero_border takes a dense (B, H, W, C) buffer")
    if tuple(buf.shape[:3]) != (b, h + top + bottom, w + left + right):
        raise ValueError(f"a buffer of {tuple(buf.shape)} is not {size} padded by {pads}")
    hp, wp, c = buf.shape[1], buf.shape[2], buf.shape[3]
    if buf.numel():
        kernel = launches.launchable(_zero_border_kernel)
        kernel[(b * hp,)](buf, hp, wp * c, c, top, h, left, w, BLOCK=BLOCK)
    return buf
