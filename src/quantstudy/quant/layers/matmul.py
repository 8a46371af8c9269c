"""Quantized layer modules: the real FP8 matrix product and the quantize-dequantize emulation.

`FP8Matmul` runs a real FP8 product (`torch._scaled_mm`) for linear layers and dense 1x1
convolutions (any stride, no padding). `QDQ` computes in a float dtype around
quantize-dequantized inputs and weights: in fp32 they are the fake-quant emulation; inside an fp16
engine they stand in for layers that have no FP8 kernel here (kxk and depthwise convs), marked as
emulated in the engine's description.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.formats.fp8 import (
    E4M3,
    dequantize_weight,
    fake_quant,
    fake_quant_rows,
    quantize_rows,
    quantize_weight,
    to_fp8,
)
from quantstudy.quant.layers.dropin import DropIn
from quantstudy.quant.layers.spec import FP8LayerSpec

# torch._scaled_mm needs both matrix dimensions of the weight divisible by 16; the fused kernel
# needs FP8 rows of 16-byte multiples for vector and descriptor loads.
ALIGN = 16


def align(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


def _plain_layer_types() -> tuple[type, ...]:
    """Layer classes whose forward is exactly conv2d/linear of their own weight.

    timm's `Conv2dSame` pads dynamically, which for a 1x1 kernel is always zero padding; timm's
    `Linear` only differs under TorchScript. Subclasses that transform the weight in `forward`
    (timm's `StdConv2d`, `ScaledStdConv2d`) are not plain: their FP8 weight would be wrong.
    """
    from timm.layers import Conv2dSame, Linear

    return (nn.Conv2d, nn.Linear, Conv2dSame, Linear)


def real_fp8_blocker(layer: nn.Module) -> str | None:
    """Why `layer` cannot run as a real FP8 matrix product here; None when it can."""
    if type(layer) not in _plain_layer_types():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            return f"{type(layer).__name__} has its own forward (weight quantized before it)"
        return f"{type(layer).__name__} is not a conv2d or linear layer"
    if isinstance(layer, nn.Conv2d):
        if layer.kernel_size != (1, 1):
            return f"kernel {layer.kernel_size[0]}x{layer.kernel_size[1]} has no FP8 conv kernel"
        if layer.groups != 1:
            return "grouped/depthwise conv has no FP8 kernel"
        if layer.padding not in ((0, 0), "valid") or layer.dilation != (1, 1):
            return "padded or dilated 1x1 conv"
    return None


FP8Weight = tuple[torch.Tensor, torch.Tensor]  # (FP8 weight in the layer's shape, its scale)


class PointwiseMatmul(DropIn):
    """A linear layer or dense 1x1 conv as one matrix product over rows: a linear's leading
    dimensions, or a conv's pixels (channels-last, strided convs subsampled first). Subclasses
    give the product of one (rows, K) matrix in `_matmul`.

    Input quantization: one static per-tensor scale (`x_scale`), or with `row_scales` one scale
    per row computed at run time (`fp8.row_scale`); a per-input-channel `x_divisor` (scale
    migration, `quant/fitting/migrate.py`) divides the input before either."""

    def _take_shape(self, layer: nn.Linear | nn.Conv2d, dtype: torch.dtype) -> None:
        self.is_conv = isinstance(layer, nn.Conv2d)
        self.take_face(layer, dtype)  # `stride` and the rest, as the layer has them

    def _take_input_quant(
        self, x_scale: float, row_scales: bool, x_divisor: torch.Tensor | None, k_pad: int
    ) -> None:
        self.register_buffer("x_scale", torch.tensor(x_scale, dtype=torch.float32))
        self.row_scales = row_scales
        divisor = None if x_divisor is None else F.pad(x_divisor.float(), (0, k_pad), value=1.0)
        self.register_buffer("x_divisor", divisor)
        # per-row quantize multiplies by the divisor's reciprocal
        # (`quant.formats.fp8.quantize_rows`)
        inverse = torch.reciprocal(divisor) if divisor is not None and row_scales else None
        self.register_buffer("x_inv_divisor", inverse)

    def _quantize_input(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """FP8 rows of the (already padded) input and their scale: scalar, or (rows, 1)."""
        if self.row_scales:
            return quantize_rows(x2d, self.x_inv_divisor)
        if self.x_divisor is not None:
            x2d = x2d / self.x_divisor.to(x2d.dtype)
        return to_fp8(x2d, self.x_scale), self.x_scale

    def _matmul(self, x2d: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """(rows, channels): a linear's leading dimensions, or a conv's pixels (a view for
        channels-last tensors)."""
        if not self.is_conv:
            return t.reshape(-1, t.shape[-1])
        return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])

    def _subsampled(self, x: torch.Tensor) -> torch.Tensor:
        """The input pixels a strided 1x1 conv reads (all of them at stride 1)."""
        if self.is_conv and self.stride != (1, 1):
            return x[:, :, :: self.stride[0], :: self.stride[1]]
        return x

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The layer on `x`; `residual` (the output's shape) is summed in the epilogue by
        layers that take one (`quant/rewrites/residual.py`)."""
        r = None if residual is None else self._rows(residual)
        x = self._subsampled(x)
        y = self._matmul(self._rows(x), r)
        if isinstance(y, tuple):  # the output and its FP8 copy for the next layer
            return tuple(self._unrows(t, x) for t in y)
        return self._unrows(y, x)

    def _unrows(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The (rows, N) product back in the layout of the (subsampled) input `x`."""
        if not self.is_conv:
            return y.reshape(*x.shape[:-1], -1)
        b, _, h, w = x.shape
        return y.reshape(b, h, w, -1).permute(0, 3, 1, 2)


@functools.cache
def scaled_mm_output(device: str, dtype: torch.dtype, rowwise: bool) -> tuple[torch.dtype, bool]:
    """The output dtype `torch._scaled_mm` writes on `device`, and whether the bias goes into
    its epilogue, best first: the engine's dtype with the bias inside (one rounding of
    sum x scales + bias, the fused kernel's arithmetic), the engine's dtype with the bias added
    after, then bf16 (cuBLASLt's row-wise scaling wrote bf16 only before CUDA 12.9 and torch
    2.10). bf16 keeps 8 significant bits where fp16 keeps 11, which moves the next layer's FP8
    rounding often enough that a bf16 unfused engine and the fused one disagree on a
    measurable share of Lite0's top-1 answers (docs/fp8-kernel.md). Probed once per device, dtype
    and scaling."""
    a = torch.zeros(16, 16, device=device).to(E4M3)
    sa = torch.ones((16, 1) if rowwise else (), device=device)
    sb = torch.ones((1, 16) if rowwise else (), device=device)
    for out, with_bias in ((dtype, True), (dtype, False), (torch.bfloat16, False)):
        bias = torch.zeros(16, device=device, dtype=out) if with_bias else None
        try:
            torch._scaled_mm(a, a.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out)
        except RuntimeError:
            continue
        return out, with_bias
    raise RuntimeError(f"torch._scaled_mm runs no FP8 product on {device}")


@functools.cache
def rowwise_scaled_mm_runs(device: str) -> bool:
    """Whether `torch._scaled_mm` on `device` takes row-wise scales at all (bf16 out, no bias:
    the form every row-wise kernel writes). Probed once per device, not read off the torch
    version: torch 2.11's CPU kernel asserts on scales that are not per-tensor, 2.14's runs."""
    a = torch.zeros(16, 16, device=device).to(E4M3)
    sa, sb = torch.ones(16, 1, device=device), torch.ones(1, 16, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


def cpu_rowwise_product(
    a: torch.Tensor,
    w8: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`torch._scaled_mm(a, w8.t(), scale_a, scale_b, bias, out_dtype)` with row-wise scales,
    computed as a CPU torch that has that kernel (2.14) computes it: each FP8 operand times its
    scales in float32, one float32 product, the bias added in float32, one rounding to
    `out_dtype` (bitwise the same there with one thread, tests/unit/test_rowwise_emulation.py).
    It serves a torch whose CPU `_scaled_mm` takes per-tensor scales only, so a CPU engine gives
    the same numbers on every supported torch. `scale_a` is (M, 1) or a scalar, `scale_b`
    (1, N) or a scalar, `w8` (N, K)."""
    y = (a.float() * scale_a) @ (w8.float() * scale_b.reshape(-1, 1)).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


class FP8Matmul(PointwiseMatmul):
    """y = (q(x) @ q(W)^T) * s_x * s_w + b with FP8 operands and float32 accumulation.

    Weights: FP8 E4M3 with a per-output-channel or per-tensor scale. Activations: one static
    per-tensor scale. Per-channel weight scales use torch._scaled_mm's row-wise scaling. The
    output dtype and the bias's place follow what the device's torch._scaled_mm supports
    (`scaled_mm_output`, chosen by `use_device` once the module is on its device; until then
    bf16 with the bias added after, which runs everywhere). Channel counts that are not
    multiples of 16 (torch._scaled_mm's alignment) are zero-padded: the weight once at build
    time, the activation inside its quantize step; padded outputs are sliced off. Zero padding
    adds exact zeros to every sum, so the result is unchanged.
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d, spec: FP8LayerSpec) -> None:
        super().__init__()
        spec.refuse("FP8Matmul", "act", "out_scale", "fp8_input")
        x_scale, per_channel, dtype = spec.static_scale("FP8Matmul"), spec.per_channel, spec.dtype
        fp8_weight, row_scales, x_divisor = spec.weight, spec.row_scales, spec.x_divisor
        self._take_shape(layer, dtype)
        weight = layer.weight.detach().float()
        weight = weight.reshape(weight.shape[0], -1)
        self.n, self.k = weight.shape
        self.k_pad = align(self.k) - self.k
        self.n_pad = align(self.n) - self.n
        w8, w_scale = fp8_weight or quantize_weight(weight, per_channel)
        w8 = w8.reshape(self.n, self.k)
        w8 = F.pad(w8.float(), (0, self.k_pad, 0, self.n_pad)).to(w8.dtype)  # exact: zeros
        if per_channel:
            w_scale = F.pad(w_scale, (0, self.n_pad), value=1.0)
        self.register_buffer("w8", w8.contiguous())  # (N, K) row-major; .t() is column-major
        self.register_buffer("w_scale", w_scale.reshape(1, -1) if per_channel else w_scale)
        self._take_input_quant(x_scale, row_scales, x_divisor, self.k_pad)
        # Rounded to the engine's dtype (as the fp16 engine and the fused layer hold it).
        bias = layer.bias.detach().to(dtype).float() if layer.bias is not None else None
        self.register_buffer("bias", bias)
        self.per_channel = per_channel
        self.dtype = dtype
        self.mm_dtype, self.bias_in_mm = (dtype, False)
        if dtype != torch.float32 and per_channel:
            self.mm_dtype = torch.bfloat16
        self.register_buffer("mm_bias", None)  # the bias as torch._scaled_mm takes it
        self.emulated = False  # row-wise product in float32 (`cpu_rowwise_product`)
        # all of K in the tensor cores (`record/build_spec.py`); any promotion but 0 is cuBLASLt's
        # own 128
        self.fast_accum = spec.promote == 0

    def use_device(self, device: torch.device) -> None:
        """Take the best output `torch._scaled_mm` supports on `device` (`scaled_mm_output`),
        and, where the bias goes into its epilogue, pad and cast the bias for it once."""
        rowwise = self.per_channel or self.row_scales
        self.emulated = rowwise and device.type == "cpu" and not rowwise_scaled_mm_runs("cpu")
        if self.emulated:  # `cpu_rowwise_product`: the engine's dtype, the bias inside
            self.mm_dtype, self.bias_in_mm = self.dtype, True
        else:
            out = scaled_mm_output(str(device), self.dtype, self.per_channel)
            self.mm_dtype, self.bias_in_mm = out
        self.mm_bias = None
        if self.bias is not None and self.bias_in_mm:
            self.mm_bias = F.pad(self.bias, (0, self.n_pad)).to(device, self.mm_dtype)

    def _matmul(self, x2d: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None:
            raise ValueError("the unfused layer's residual sum follows its activation, outside it")
        if self.k_pad:
            x2d = F.pad(x2d, (0, self.k_pad))
        xq, x_scale = self._quantize_input(x2d)
        if self.per_channel or self.row_scales:
            scale_a = x_scale.reshape(-1, 1).expand(x2d.shape[0], 1).contiguous()
        else:
            scale_a = x_scale
        if self.emulated:
            y = cpu_rowwise_product(xq, self.w8, scale_a, self.w_scale, self.mm_bias, self.mm_dtype)
        else:
            y = torch._scaled_mm(
                xq,
                self.w8.t(),
                scale_a=scale_a,
                scale_b=self.w_scale,
                bias=self.mm_bias,
                out_dtype=self.mm_dtype,
                use_fast_accum=self.fast_accum,
            )
        y = y[:, : self.n]
        if self.bias is not None and self.mm_bias is None:  # float32, one rounding below
            y = y.float() + self.bias
        return y.to(self.dtype)


def bind_scaled_mm(model: nn.Module, device: torch.device) -> None:
    """Let every `FP8Matmul` in `model` (already on `device`) take its output there."""
    for module in model.modules():
        if isinstance(module, FP8Matmul):
            module.use_device(device)


def scaled_mm_output_of(model: nn.Module) -> str | None:
    """What the `FP8Matmul` layers of `model` have torch._scaled_mm write, in words (one
    probe per device and dtype, so one answer per engine); None without such layers."""
    found = {
        (str(m.mm_dtype).removeprefix("torch."), m.bias_in_mm, m.emulated)
        for m in model.modules()
        if isinstance(m, FP8Matmul)
    }
    place = {True: "bias in its epilogue", False: "bias added after, in float32"}
    how = {False: "", True: " (row-wise scales emulated: float32 product of the scaled FP8 values)"}
    return (
        "; ".join(f"{dtype}, {place[inside]}{how[emu]}" for dtype, inside, emu in sorted(found))
        or None
    )


class QDQ(DropIn):
    """A copy of the original layer with quantize-dequantized weights, behind an input quantizer.

    Wrapping a copy keeps the layer's own forward (timm's `Conv2dSame` pads dynamically, for
    example), so only the quantization points change. `x_scale` None leaves inputs unquantized
    (weight-only runs); `quant_weights` False leaves weights unquantized (activation-only runs).
    """

    def __init__(self, layer: nn.Module, spec: FP8LayerSpec, quant_weights: bool = True) -> None:
        super().__init__()
        spec.refuse("QDQ", "act", "out_scale", "fp8_input")
        x_scale, per_channel, dtype = spec.x_scale, spec.per_channel, spec.dtype
        fp8_weight, row_scales, x_divisor = spec.weight, spec.row_scales, spec.x_divisor
        inner = copy.deepcopy(layer).to(dtype)
        # With a divisor the layer computes W diag(d) (x / d): the weight it stores (and
        # `fp8_weight`, when given) is the migrated one.
        divisor = None if x_divisor is None else x_divisor.float()
        if divisor is not None:
            view = (1, -1) + (1,) * (inner.weight.dim() - 2)
            with torch.no_grad():
                inner.weight.mul_(divisor.reshape(view).to(dtype))
        if quant_weights:
            w = layer.weight.detach().float()
            if divisor is not None:
                w = w * divisor.reshape(view)
            w8, scale = fp8_weight or quantize_weight(w, per_channel)
            with torch.no_grad():
                inner.weight.copy_(dequantize_weight(w8, scale, dtype).reshape(inner.weight.shape))
        self.inner = inner
        self.take_face(layer, dtype)
        self.is_conv = isinstance(layer, nn.Conv2d)
        self.row_scales = row_scales and x_scale is not None
        scale = None if x_scale is None else torch.tensor(x_scale, dtype=torch.float32)
        self.register_buffer("x_scale", scale)
        self.register_buffer("x_divisor", divisor)

    @property
    def weight(self) -> torch.Tensor:
        """The weight this emulation computes with (quantize-dequantized unless weights are
        left float): the wrapped copy's own, no copy made."""
        return self.inner.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.inner.bias

    def channel_view(self, x: torch.Tensor) -> list[int]:
        """Shape that broadcasts a per-input-channel vector over `x`."""
        view = [1] * x.dim()
        view[1 if self.is_conv else -1] = -1
        return view

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the layer's product reads it: divided by the migration divisor, then
        FP8 quantize-dequantized (static or per-row scale); unchanged without a scale."""
        if self.x_divisor is not None:
            x = x / self.x_divisor.reshape(self.channel_view(x)).to(x.dtype)
        if self.x_scale is not None:
            channel = 1 if self.is_conv else -1
            x = fake_quant_rows(x, channel) if self.row_scales else fake_quant(x, self.x_scale)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.quantize_input(x))
