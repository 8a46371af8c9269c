"""The fused FP8 depthwise convolution: FP8 storage around a depthwise conv the recipe selects.

Why: in the inverted-residual CNNs the depthwise convs take the same time in the fp16 and FP8
engines (docs/fp8-kernel.md, "All six models"), because both read and write fp16 around them. With
the depthwise conv selected, the 1x1 conv before it writes its output in FP8 (a hand-off,
`quant/rewrites/handoff.py`), this layer reads it, applies the folded BatchNorm bias and the
activation in its epilogue, and writes the next FP8 layer's input: a memory-bound conv that moves
half the bytes. The quantization is the emulation's (`QDQ`): static per-tensor input scale, FP8
weights (per channel or per tensor), float32 sums; the scales multiply after the sum. The products
run on CUDA cores in float32 (a depthwise conv has no matrix product for FP8 tensor cores): what FP8
buys here is the bytes of the activations and weights.

On CUDA the conv is `quant/kernels/depthwise.py`'s kernel; elsewhere the same arithmetic in torch
(`F.conv2d` with groups), so CPU tests and CPU engines check the layer without a GPU. Both run
behind one operator (`quant/layers/opdef.py`); the input quantize, when the producer writes no FP8,
stays a torch expression that Inductor fuses into the producing kernel. The epilogue does not
round through the engine's dtype: no unfused engine runs this conv to agree with (scaled_mm
engines emulate it), and the emulation keeps float32.
"""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3, quantize_weight, to_fp8
from quantstudy.quant.kernels.layout import same_padding, taps_of
from quantstudy.quant.layers.dropin import DropIn
from quantstudy.quant.layers.fused_matmul import (
    act_reference,
    handed_input,
    io_repr,
    take_epilogue,
)
from quantstudy.quant.layers.opdef import OpArgs, fp8_op
from quantstudy.quant.layers.spec import FP8LayerSpec


def _same_pad_types() -> tuple[type, ...]:
    from timm.layers import Conv2dSame

    return (Conv2dSame,)


def depthwise_fp8_blocker(layer: nn.Module) -> str | None:
    """Why `layer` cannot run as a fused FP8 depthwise conv; None when it can: a plain
    `nn.Conv2d` with fixed zero padding or timm's `Conv2dSame` (TensorFlow "same" padding),
    one channel per group, one stride for both axes, no dilation."""
    same = isinstance(layer, _same_pad_types())
    if type(layer) is not nn.Conv2d and not same:
        return f"{type(layer).__name__} is not a plain Conv2d (depthwise FP8 kernel)"
    if not (layer.groups == layer.in_channels == layer.out_channels):
        return "not a depthwise conv (one channel per group)"
    if layer.dilation != (1, 1) or layer.stride[0] != layer.stride[1]:
        return "dilated depthwise conv, or one with two strides, has no FP8 kernel"
    if layer.padding_mode != "zeros" or (isinstance(layer.padding, str) and not same):
        return f"padding {layer.padding!r} ({layer.padding_mode}) has no FP8 depthwise kernel"
    return None


def _depthwise_shape(a: OpArgs) -> torch.Tensor:
    """Channels-last (B, C, HO, WO), as the kernel writes it."""
    out = a.xq.new_empty((a.xq.shape[0], *a.out_hw, a.xq.shape[1]), dtype=a.out_dtype)
    return out.permute(0, 3, 1, 2)


# int lists typed typing.Sequence[int]: torch 2.6's schema inference refuses list[int]
@fp8_op("fp8_depthwise", fake=_depthwise_shape)
def fp8_depthwise(
    xq: torch.Tensor,
    taps: torch.Tensor,
    w_scale: torch.Tensor,
    kernel_hw: typing.Sequence[int],
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    stride: int,
    pad: typing.Sequence[int],
    out_hw: typing.Sequence[int],
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(depthwise(xq, taps) * x_scale * w_scale + bias), channels-last (B, C, HO, WO) in
    `out_dtype` (the next layer's FP8 input with `out_scale`); xq (B, C, H, W) and `taps`
    (KH * KW, C: one row of channels per tap) FP8, w_scale (C,) float32, `pad` the top/left
    zero padding."""
    if xq.is_cuda:
        from quantstudy.quant.kernels.depthwise import depthwise_taps

        return depthwise_taps(
            xq, taps, tuple(kernel_hw), bias, stride, tuple(pad), tuple(out_hw), act, x_scale,
            out_scale, out_dtype, w_scale=w_scale,
        )  # fmt: skip
    kh, kw = kernel_hw
    c = xq.shape[1]
    w = taps.float().t().reshape(c, 1, kh, kw)
    # bottom/right padding that yields out_hw (negative: the rows a strided conv never reads)
    extra = [(out_hw[i] - 1) * stride + kernel_hw[i] - xq.shape[2 + i] - pad[i] for i in range(2)]
    x = F.pad(xq.float(), (pad[1], extra[1], pad[0], extra[0]))
    y = F.conv2d(x, w, stride=stride, groups=c) * (w_scale * x_scale)[None, :, None, None]
    if bias is not None:
        y = y + bias[None, :, None, None]
    y = act_reference(y, act)
    y = to_fp8(y, out_scale) if out_scale is not None else y.to(out_dtype)
    return y.contiguous(memory_format=torch.channels_last)


class FusedFP8Depthwise(DropIn):
    """A depthwise conv reading and writing FP8 (module docstring); `spec` as
    `FusedFP8Matmul`'s, `spec.weight` the plan's stored FP8 weight (nearest rounding otherwise),
    without dynamic input scales."""

    def __init__(self, layer: nn.Conv2d, spec: FP8LayerSpec) -> None:
        super().__init__()
        spec.refuse("FusedFP8Depthwise", "row_scales", "x_divisor")
        x_scale, per_channel = spec.static_scale("FusedFP8Depthwise"), spec.per_channel
        dtype, act, out_scale, fp8_input = spec.dtype, spec.act, spec.out_scale, spec.fp8_input
        weight = spec.weight
        blocker = depthwise_fp8_blocker(layer)
        if blocker is not None:
            raise ValueError(blocker)
        w8, w_scale = weight or quantize_weight(layer.weight.detach().float(), per_channel)
        c = layer.out_channels
        self.kernel_hw = [int(k) for k in layer.kernel_size]
        self.same = isinstance(layer, _same_pad_types())
        # `stride` (one for both axes) and `padding` ((0, 0) under "same"): the layer's tuples
        self.take_face(layer, dtype)
        self.register_buffer("taps", taps_of(w8))  # (KH * KW, C) FP8
        self.register_buffer("w_scale", w_scale.float().expand(c).contiguous())
        self.register_buffer("x_scale", torch.tensor(x_scale, dtype=torch.float32))
        take_epilogue(self, layer, dtype, act, out_scale, fp8_input)

    def geometry(self, h: int, w: int) -> tuple[list[int], list[int]]:
        """(top/left padding, output size) for an (h, w) input."""
        if self.same:
            (ho, ph), (wo, pw) = (same_padding(n, k, self.stride[0]) for n, k in
                                  zip((h, w), self.kernel_hw, strict=True))  # fmt: skip
            return [ph, pw], [ho, wo]
        out = [(n + 2 * p - k) // self.stride[0] + 1
               for n, p, k in zip((h, w), self.padding, self.kernel_hw, strict=True)]  # fmt: skip
        return list(self.padding), out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = handed_input(self, x) if self.fp8_input else to_fp8(x, self.x_scale)
        xq = xq.contiguous(memory_format=torch.channels_last)
        pad, out_hw = self.geometry(x.shape[2], x.shape[3])
        out_dtype = E4M3 if self.out_scale is not None else self.dtype
        return fp8_depthwise(
            xq, self.taps, self.w_scale, self.kernel_hw, self.x_scale, self.bias, self.act,
            out_dtype, self.stride[0], pad, out_hw, self.out_scale,
        )  # fmt: skip

    def extra_repr(self) -> str:
        kh, kw = self.kernel_hw
        pad = "same" if self.same else tuple(self.padding)
        return (
            f"c={self.taps.shape[1]}, kernel={kh}x{kw}, stride={self.stride[0]}, padding={pad}, "
            f"act={self.act}{io_repr(self)}"
        )
