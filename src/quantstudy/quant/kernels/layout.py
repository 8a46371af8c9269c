"""How the depthwise kernel reads its weight and pads its input, importable without Triton.

The FP8 depthwise layer stores its weight in this layout once at build, and the kernel module
reads it; keeping the layout here lets the layer module (which runs on CPU-only installs) and
the kernel module (which needs Triton) both import it without importing each other.
"""

from __future__ import annotations

import torch


def taps_of(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise weight (C, 1, KH, KW) as `kernels/depthwise.py`'s kernel reads it: (KH * KW,
    C), one contiguous row of channels per tap, in the weight's dtype (float32, or FP8 with a
    per-channel scale)."""
    return weight.reshape(weight.shape[0], -1).t().contiguous()


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "same" padding (timm's Conv2dSame): output ceil(size / stride), the odd pixel
    of padding at the end. Returns (output size, padding before)."""
    from timm.layers.padding import get_same_padding

    return -(-size // stride), get_same_padding(size, kernel, stride, 1) // 2
