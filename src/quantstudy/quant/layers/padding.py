"""The zero padding a conv applies to its input, as a producer can write it around its output.

Two forms reach a fused FP8 layer's output in timm models (`quant/rewrites/pad_handoff.py`):
TensorFlow's "same" padding (`Conv2dSame`: computed from the input size at run time, the extra pixel
at the bottom and right), and a fixed `nn.ZeroPad2d` before a conv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def same_pad(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) of TensorFlow's "same" padding on one axis of `size` pixels: enough that
    ceil(size / stride) outputs fit, the odd pixel after."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


@dataclass(frozen=True)
class OutputPad:
    """Zero padding of an (H, W) map: "same" for `kernel`, `stride`, `dilation` (each (h, w)),
    or `fixed` (left, right, top, bottom)."""

    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    fixed: tuple[int, int, int, int] | None = None

    def pads(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(left, right, top, bottom), the order `F.pad` takes for the last two dimensions."""
        if self.fixed is not None:
            return self.fixed
        top, bottom = same_pad(h, self.kernel[0], self.stride[0], self.dilation[0])
        left, right = same_pad(w, self.kernel[1], self.stride[1], self.dilation[1])
        return left, right, top, bottom

    def __str__(self) -> str:
        if self.fixed is not None:
            return f"zero {self.fixed}"
        return f"same k={self.kernel} s={self.stride} d={self.dilation}"
