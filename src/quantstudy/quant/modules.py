"""Quantized layer modules: the real FP8 matrix product and the quantize-dequantize emulation.

`FP8Matmul` runs a real FP8 product (`torch._scaled_mm`) for linear layers and dense 1x1
convolutions (any stride, no padding). `QDQ` computes in a float dtype around
quantize-dequantized inputs and weights: in fp32 they are the fake-quant emulation; inside an fp16
engine they stand in for layers that have no FP8 kernel here (kxk and depthwise convs), marked as
emulated in the engine's description.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from quantstudy.quant.fp8 import dequantize_weight, fake_quant, quantize_weight, to_fp8

_ALIGN = 16  # torch._scaled_mm needs both matrix dimensions of the weight divisible by 16


def real_fp8_blocker(layer: nn.Module) -> str | None:
    """Why `layer` cannot run as a real FP8 matrix product here; None when it can."""
    if isinstance(layer, nn.Conv2d):
        if layer.kernel_size != (1, 1):
            return f"kernel {layer.kernel_size[0]}x{layer.kernel_size[1]} has no FP8 conv kernel"
        if layer.groups != 1:
            return "grouped/depthwise conv has no FP8 kernel"
        if layer.padding not in ((0, 0), "valid") or layer.dilation != (1, 1):
            return "padded or dilated 1x1 conv"
        k, n = layer.in_channels, layer.out_channels
    elif isinstance(layer, nn.Linear):
        k, n = layer.in_features, layer.out_features
    else:
        return f"{type(layer).__name__} is not a conv2d or linear layer"
    if k % _ALIGN or n % _ALIGN:
        return f"channels {k}->{n} not multiples of {_ALIGN} (torch._scaled_mm alignment)"
    return None


class FP8Matmul(nn.Module):
    """y = (q(x) @ q(W)^T) * s_x * s_w + b with FP8 operands and float32 accumulation.

    Weights: FP8 E4M3 with a per-output-channel or per-tensor scale. Activations: one static
    per-tensor scale. Per-channel weight scales use torch._scaled_mm's row-wise scaling, whose
    CUDA kernels write bf16; the result is then cast to the engine's dtype.
    """

    def __init__(
        self, layer: nn.Linear | nn.Conv2d, x_scale: float, per_channel: bool, dtype: torch.dtype
    ) -> None:
        super().__init__()
        weight = layer.weight.detach().float()
        self.is_conv = isinstance(layer, nn.Conv2d)
        self.stride = layer.stride if self.is_conv else (1, 1)
        w8, w_scale = quantize_weight(weight.reshape(weight.shape[0], -1), per_channel)
        self.register_buffer("w8", w8.contiguous())  # (N, K) row-major; .t() is column-major
        self.register_buffer("w_scale", w_scale.reshape(1, -1) if per_channel else w_scale)
        self.register_buffer("x_scale", torch.tensor(x_scale, dtype=torch.float32))
        bias = layer.bias.detach().to(dtype) if layer.bias is not None else None
        self.register_buffer("bias", bias)
        self.per_channel = per_channel
        self.dtype = dtype
        # Row-wise scaling writes bf16 on CUDA; fp32 compute (CPU checks) keeps fp32 throughout.
        if dtype == torch.float32:
            self.mm_dtype = torch.float32
        else:
            self.mm_dtype = torch.bfloat16 if per_channel else dtype

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:
        xq = to_fp8(x2d, self.x_scale)
        if self.per_channel:
            scale_a = self.x_scale.reshape(1, 1).expand(x2d.shape[0], 1).contiguous()
        else:
            scale_a = self.x_scale
        y = torch._scaled_mm(
            xq, self.w8.t(), scale_a=scale_a, scale_b=self.w_scale, out_dtype=self.mm_dtype
        ).to(self.dtype)
        return y + self.bias if self.bias is not None else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_conv:
            lead = x.shape[:-1]
            return self._matmul(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)
        sh, sw = self.stride
        if (sh, sw) != (1, 1):
            x = x[:, :, ::sh, ::sw]
        b, c, h, w = x.shape
        y = self._matmul(x.permute(0, 2, 3, 1).reshape(-1, c))
        return y.reshape(b, h, w, -1).permute(0, 3, 1, 2)


class QDQ(nn.Module):
    """A copy of the original layer with quantize-dequantized weights, behind an input quantizer.

    Wrapping a copy keeps the layer's own forward (timm's `Conv2dSame` pads dynamically, for
    example), so only the quantization points change. `x_scale` None leaves inputs unquantized
    (weight-only runs); `quant_weights` False leaves weights unquantized (activation-only runs).
    """

    def __init__(
        self,
        layer: nn.Module,
        x_scale: float | None,
        quant_weights: bool,
        per_channel: bool,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        inner = copy.deepcopy(layer).to(dtype)
        if quant_weights:
            w8, scale = quantize_weight(layer.weight.detach().float(), per_channel)
            with torch.no_grad():
                inner.weight.copy_(dequantize_weight(w8, scale, dtype))
        self.inner = inner
        scale = None if x_scale is None else torch.tensor(x_scale, dtype=torch.float32)
        self.register_buffer("x_scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.x_scale is not None:
            x = fake_quant(x, self.x_scale)
        return self.inner(x)
