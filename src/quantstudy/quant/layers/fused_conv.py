"""The fused FP8 k x k convolution layer: one kernel for the conv, scales, bias and activation.

The kxk counterpart of `quant/layers/fused_matmul.py`'s `FusedFP8Matmul`, for dense convs the recipe
selects that no 1x1 product covers (res2net's 3x3 convs). Same quantization as the emulation
(`QDQ`): static per-tensor input scale, per-channel or per-tensor FP8 weights from the float32
layer, zero padding, float32 sums. On CUDA the conv is the implicit-GEMM Triton kernel of
`quant/kernels/conv.py`; elsewhere the same arithmetic in torch (exact FP8 products summed in
float32 by `F.conv2d`), so CPU tests and CPU engines check the layer without a GPU. Both run
behind one operator (`quant/layers/opdef.py`); the input quantize stays a torch expression that
Inductor fuses into the producing kernel.
"""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3, quantize_weight, to_fp8
from quantstudy.quant.layers.dropin import DropIn
from quantstudy.quant.layers.fused_matmul import (
    act_reference,
    handed_input,
    io_repr,
    take_epilogue,
)
from quantstudy.quant.layers.opdef import OpArgs, fp8_op
from quantstudy.quant.layers.spec import FP8LayerSpec


def kxk_fp8_blocker(layer: nn.Module) -> str | None:
    """Why `layer` cannot run as a fused FP8 kxk conv; None when it can: a plain `nn.Conv2d`
    (timm's `Conv2dSame` pads at run time, asymmetrically), dense, zero-padded by a fixed
    amount."""
    if type(layer) is not nn.Conv2d:
        return f"{type(layer).__name__} is not a plain Conv2d (kxk FP8 kernel)"
    if layer.groups != 1:
        return "grouped/depthwise conv has no FP8 kernel"
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
        return f"padding {layer.padding!r} ({layer.padding_mode}) has no FP8 conv kernel"
    return None


def _out_hw(
    x: torch.Tensor,
    kernel_hw: typing.Sequence[int],
    stride: typing.Sequence[int],
    padding: typing.Sequence[int],
    dilation: typing.Sequence[int],
) -> list[int]:
    return [
        (x.shape[2 + i] + 2 * padding[i] - dilation[i] * (kernel_hw[i] - 1) - 1) // stride[i] + 1
        for i in range(2)
    ]


def _conv_shape(a: OpArgs) -> torch.Tensor:
    """Channels-last (B, N, HO, WO), as the kernel writes it."""
    ho, wo = _out_hw(a.xq, a.kernel_hw, a.stride, a.padding, a.dilation)
    out = a.xq.new_empty((a.xq.shape[0], ho, wo, a.w_taps.shape[0]), dtype=a.out_dtype)
    return out.permute(0, 3, 1, 2)


# int lists typed typing.Sequence[int]: torch 2.6's schema inference refuses list[int]
@fp8_op("fp8_conv2d", fake=_conv_shape)
def fp8_conv2d(
    xq: torch.Tensor,
    w_taps: torch.Tensor,
    kernel_hw: typing.Sequence[int],
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    stride: typing.Sequence[int],
    padding: typing.Sequence[int],
    dilation: typing.Sequence[int],
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    promote: int = 0,
) -> torch.Tensor:
    """act(conv(xq, w8) * x_scale * w_scale + bias), channels-last (B, N, HO, WO) in
    `out_dtype` (the next layer's FP8 input with `out_scale`); xq (B, C, H, W) and `w_taps`
    (N, KH * KW * C, tap-major, `quant.kernels.conv.tap_major`) FP8. `round_to` as in
    `fused_matmul.fp8_gemm`, and `promote`."""
    if xq.is_cuda:
        from quantstudy.quant.kernels.conv import fp8_conv2d_triton

        return fp8_conv2d_triton(
            xq, w_taps, tuple(kernel_hw), w_scale, x_scale, bias, act, out_dtype,
            tuple(stride), tuple(padding), tuple(dilation), out_scale, round_to, promote=promote,
        )  # fmt: skip

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.to(round_to).float() if round_to is not None else t

    kh, kw = kernel_hw
    n, c = w_taps.shape[0], xq.shape[1]
    w = w_taps.float().reshape(n, kh, kw, c).permute(0, 3, 1, 2)
    y = F.conv2d(xq.float(), w, stride=stride, padding=padding, dilation=dilation)
    y = y * (w_scale * x_scale)[None, :, None, None]
    if bias is not None:
        y = y + bias[None, :, None, None]
    y = act_reference(rounded(y), act)
    y = to_fp8(rounded(y), out_scale) if out_scale is not None else y.to(out_dtype)
    return y.contiguous(memory_format=torch.channels_last)


class FusedFP8Conv2d(DropIn):
    """A dense kxk conv as one fused FP8 kernel (module docstring); `spec` as
    `FusedFP8Matmul`'s, without a stored weight or dynamic input scales: nearest weights, a
    static per-tensor input."""

    def __init__(self, layer: nn.Conv2d, spec: FP8LayerSpec) -> None:
        super().__init__()
        spec.refuse("FusedFP8Conv2d", "weight", "row_scales", "x_divisor")
        x_scale, per_channel = spec.static_scale("FusedFP8Conv2d"), spec.per_channel
        dtype, act, out_scale, fp8_input = spec.dtype, spec.act, spec.out_scale, spec.fp8_input
        blocker = kxk_fp8_blocker(layer)
        if blocker is not None:
            raise ValueError(blocker)
        w8, w_scale = quantize_weight(layer.weight.detach().float(), per_channel)
        # Channels padded to 16 (weights once, the input inside its quantize): FP8 pixel rows of
        # 26 or 52 bytes (res2net) take byte loads, and those convs ran several times slower
        # than on rows padded to 32 or 64 (`tools/lab/bench/conv.py`, docs/fp8-kernel.md).
        self.c_pad = -w8.shape[1] % 16
        if fp8_input and self.c_pad:
            raise ValueError("an FP8 input cannot be padded here: its producer writes C channels")
        w8 = F.pad(w8.float(), (0, 0, 0, 0, 0, self.c_pad)).to(w8.dtype)  # exact: FP8 zeros
        self.kernel_hw = [int(k) for k in layer.kernel_size]
        self.take_face(layer, dtype)  # `stride`, `padding`, `dilation`: the layer's tuples
        taps = w8.permute(0, 2, 3, 1).reshape(w8.shape[0], -1)  # `quant.kernels.conv.tap_major`
        self.register_buffer("w_taps", taps.contiguous())
        self.register_buffer("w_scale", w_scale.expand(w8.shape[0]).contiguous())
        self.register_buffer("x_scale", torch.tensor(x_scale, dtype=torch.float32))
        take_epilogue(self, layer, dtype, act, out_scale, fp8_input)
        self.promote = spec.promote  # how the products sum (`record/build_spec.py`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8_input:
            xq = handed_input(self, x)
        else:
            if self.c_pad:
                x = F.pad(x, (0, 0, 0, 0, 0, self.c_pad))
            # channels-last whatever layout Inductor would pick: the kernel's loads coalesce
            # along channels
            xq = to_fp8(x, self.x_scale).contiguous(memory_format=torch.channels_last)
        out_dtype = E4M3 if self.out_scale is not None else self.dtype
        return fp8_conv2d(
            xq, self.w_taps, self.kernel_hw, self.w_scale, self.x_scale, self.bias, self.act,
            out_dtype, self.stride, self.padding, self.dilation, self.out_scale, self.dtype,
            self.promote,
        )  # fmt: skip

    def extra_repr(self) -> str:
        kh, kw = self.kernel_hw
        return (
            f"n={self.w_taps.shape[0]}, kernel={kh}x{kw}, stride={tuple(self.stride)}, "
            f"padding={tuple(self.padding)}, c_pad={self.c_pad}, act={self.act}{io_repr(self)}"
        )
