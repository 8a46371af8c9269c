"""The fused FP8 layer: one kernel for the product, per-channel scale, bias and activation.

Why: on the GPU the unfused layer (`FP8Matmul`: `torch._scaled_mm` writing bf16, then cast,
bias and activation in a separate pass) lost to fp16 at every batch, and the byte counts put
most of the loss in the extra passes over the layer's output (docs/fp8-kernel.md).
`FusedFP8Matmul` writes its output once, activation applied, in the engine's dtype. The input
quantize stays a plain torch expression so that Inductor fuses it into the producing kernel;
with dynamic per-row scales the kernel quantizes the input itself (`quant/kernels/gemm.py`).

On CUDA the product is the Triton kernel of `quant/kernels/gemm.py`; elsewhere the same arithmetic
in torch (exact FP8 products summed in float32), so CPU tests check the layer and the activation
absorption without a GPU. Both run behind one operator (`quant/layers/opdef.py`: opaque to the
study's Inductor, traced into by a package's AOTInductor).
"""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3, quantize_rows, quantize_weight, to_fp8
from quantstudy.quant.layers.matmul import PointwiseMatmul, align
from quantstudy.quant.layers.opdef import OpArgs, fp8_op
from quantstudy.quant.layers.padding import OutputPad
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.record.vocab import Activation

# Activation modules the epilogue computes, by exact type (subclasses may change the forward).
ACTIVATIONS: dict[type, Activation] = {
    nn.ReLU: Activation.RELU,
    nn.ReLU6: Activation.RELU6,
    nn.SiLU: Activation.SILU,
    nn.Hardswish: Activation.HARDSWISH,
}


def activation_name(module: nn.Module) -> Activation | None:
    """The epilogue's activation for `module`, or None when the epilogue cannot compute it."""
    if type(module) in ACTIVATIONS:
        return ACTIVATIONS[type(module)]
    if type(module) is nn.GELU and module.approximate == "none":
        return Activation.GELU
    try:
        from timm.layers.activations import GELU
    except ImportError:  # pragma: no cover - timm is a dependency
        return None
    return Activation.GELU if type(module) is GELU else None


def act_reference(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == Activation.RELU:
        return y.clamp_min(0.0)
    if act == Activation.RELU6:
        return y.clamp(0.0, 6.0)
    if act == Activation.SILU:
        return torch.nn.functional.silu(y)
    if act == Activation.HARDSWISH:
        return y * (y + 3.0).clamp(0.0, 6.0) / 6.0
    if act == Activation.GELU:
        return torch.nn.functional.gelu(y)
    return y


def _product_shape(a: OpArgs) -> torch.Tensor:
    return a.xq.new_empty((a.xq.shape[0], a.w8.shape[0]), dtype=a.out_dtype)


@fp8_op("fp8_gemm", fake=_product_shape)
def fp8_gemm(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    residual: torch.Tensor | None = None,
    res_act: str = Activation.NONE,
    x_inv_divisor: torch.Tensor | None = None,
    promote: int = 0,
) -> torch.Tensor:
    """act((xq @ w8^T) * x_scale * w_scale + bias) in `out_dtype`; xq (M, K), w8 (N, K) FP8,
    x_scale a scalar or one scale per row (M, 1). An xq in the engine's dtype is quantized here
    with dynamic per-row scales after the product with `x_inv_divisor`
    (`quant.formats.fp8.quantize_rows`; on CUDA in the kernel's prologue, no pass of its own), and
    w8 may then be K-padded beyond it. With `residual` (M, N) in the engine's dtype,
    res_act(that + residual): the residual sum of `quant/rewrites/residual.py`.
    With `out_scale` the result is written as the next layer's FP8 input (`to_fp8`).
    `round_to` (the engine's dtype) rounds the sum before the activation and the activated
    value before an FP8 write, where the unfused engine stores them: both engines then
    quantize the same numbers. `promote`: products the tensor cores sum before float32 takes
    over (0: all of K; the layer's `FP8LayerSpec.promote`); off CUDA the sums are exact."""
    if xq.is_cuda:
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton

        xq = xq.contiguous()
        return fp8_gemm_triton(
            xq, w8, w_scale, x_scale, bias, act, out_dtype, out_scale=out_scale,
            round_to=round_to, residual=residual, res_act=res_act, x_inv_divisor=x_inv_divisor,
            promote=promote,
        )  # fmt: skip
    return _gemm_reference(
        xq, w8, w_scale, x_scale, bias, act, out_dtype, out_scale, round_to, residual, res_act,
        x_inv_divisor,
    )  # fmt: skip


def _gemm_reference(
    xq: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, x_scale: torch.Tensor,
    bias: torch.Tensor | None, act: str, out_dtype: torch.dtype, out_scale: torch.Tensor | None,
    round_to: torch.dtype | None, residual: torch.Tensor | None, res_act: str,
    x_inv_divisor: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """`fp8_gemm` in torch (off CUDA): an unquantized input quantized per row first, then
    `_torch_epilogue`."""
    if xq.dtype != E4M3:
        divisor = x_inv_divisor[: xq.shape[1]] if x_inv_divisor is not None else None
        xq, x_scale = quantize_rows(xq, divisor)
        xq = F.pad(xq.float(), (0, w8.shape[1] - xq.shape[1])).to(E4M3)  # exact: FP8 zeros
    y = _torch_epilogue(xq, w8, w_scale, x_scale, bias, act, round_to, residual, res_act)
    return to_fp8(_rounded(y, round_to), out_scale) if out_scale is not None else y.to(out_dtype)


def _rounded(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype).float() if dtype is not None else t


def _torch_epilogue(
    xq: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, x_scale: torch.Tensor,
    bias: torch.Tensor | None, act: str, round_to: torch.dtype | None,
    residual: torch.Tensor | None, res_act: str,
) -> torch.Tensor:  # fmt: skip
    """The op's arithmetic in torch (off CUDA): exact FP8 products summed in float32, then
    the epilogue, rounded to `round_to` where the unfused engine stores; float32 out."""
    y = (xq.float() @ w8.float().t()) * (w_scale * x_scale)
    if bias is not None:
        y = y + bias
    y = act_reference(_rounded(y, round_to), act)
    if residual is not None:
        y = act_reference(_rounded(_rounded(y, round_to) + residual.float(), round_to), res_act)
    return y


def _pair_shapes(a: OpArgs) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (a.xq.shape[0], a.w8.shape[0])
    return a.xq.new_empty(shape, dtype=a.out_dtype), a.xq.new_empty(shape, dtype=E4M3)


@fp8_op("fp8_gemm_pair", fake=_pair_shapes)
def fp8_gemm_pair(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    pair_scale: torch.Tensor,
    round_to: torch.dtype | None,
    residual: torch.Tensor | None,
    res_act: str,
    promote: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_gemm` writing two outputs from one epilogue: the result in `out_dtype` and its
    FP8 copy quantized with `pair_scale`, the next FP8 layer's input (a residual sum read
    both by that layer and by the next shortcut, `quant/rewrites/residual.py`)."""
    if xq.is_cuda:
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton

        xq = xq.contiguous()
        q = torch.empty((xq.shape[0], w8.shape[0]), device=xq.device, dtype=E4M3)
        y = fp8_gemm_triton(
            xq, w8, w_scale, x_scale, bias, act, out_dtype, out_scale=pair_scale,
            round_to=round_to, residual=residual, res_act=res_act, pair=q, promote=promote,
        )  # fmt: skip
        return y, q
    y = _torch_epilogue(xq, w8, w_scale, x_scale, bias, act, round_to, residual, res_act)
    return y.to(out_dtype), to_fp8(_rounded(y, round_to), pair_scale)


def _padded_shape(a: OpArgs) -> torch.Tensor:
    (b, h, w), (left, right, top, bottom) = a.size, a.pads
    shape = (b, h + top + bottom, w + left + right, a.w8.shape[0])
    return a.xq.new_empty(shape, dtype=a.out_dtype)


# int lists typed typing.Sequence[int]: torch 2.6's schema inference refuses list[int]
@fp8_op("fp8_gemm_padded", fake=_padded_shape)
def fp8_gemm_padded(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    round_to: torch.dtype | None,
    x_inv_divisor: torch.Tensor | None,
    size: typing.Sequence[int],
    pads: typing.Sequence[int],
    promote: int = 0,
) -> torch.Tensor:
    """`fp8_gemm` of a conv's B x H x W pixels (`size`) written into the interior of a
    zero-padded (B, H + top + bottom, W + left + right, N) buffer, `pads` (left, right, top,
    bottom) as `F.pad` takes them: the padding the next conv would apply
    (`quant/rewrites/pad_handoff.py`), with no pass of its own.

    Traced into a package, both kernels are handed the whole buffer, no view of it: the border
    kernel the buffer, the product its interior's origin in it (`fp8_gemm_triton(out_base=)`).
    A tracer turns a kernel's write through a view into a copy of the view and a scatter back,
    and torch 2.11's AOTInductor gets both wrong for a padded buffer: handed the interior view,
    the compact copy is shorter than the strides the kernel was given (an illegal memory
    access, pytorch/pytorch#161115, fixed by #184050; #192510); handed a 1-D view from the
    interior's first element, the scatter back lands at the buffer's start, not at the view's
    offset, and moves the border into the picture (docs/package.md). Written whole, the buffer
    also takes no copies, which cost several full passes over it. The study's engine, which
    no tracer sees, writes the interior view as it always has: the same bytes."""
    b, h, w = size
    left, right, top, bottom = pads
    n = w8.shape[0]
    if xq.is_cuda:
        from quantstudy.quant.kernels import launches
        from quantstudy.quant.kernels.border import zero_border
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton

        out = torch.empty((b, h + top + bottom, w + left + right, n), device=xq.device,
                          dtype=out_dtype)  # fmt: skip
        zero_border(out, size, pads)
        fp8_gemm_triton(
            xq.contiguous(), w8, w_scale, x_scale, bias, act, out_dtype, round_to=round_to,
            x_inv_divisor=x_inv_divisor, out=out[:, top : top + h, left : left + w],
            out_base=out if launches.is_replaying() else None, promote=promote,
        )  # fmt: skip
        return out
    y = _gemm_reference(xq, w8, w_scale, x_scale, bias, act, out_dtype, None, round_to, None,
                        Activation.NONE, x_inv_divisor)  # fmt: skip
    return F.pad(y.reshape(b, h, w, n), (0, 0, left, right, top, bottom))


def take_epilogue(
    module: nn.Module,
    layer: nn.Module,
    dtype: torch.dtype,
    act: str,
    out_scale: float | None,
    fp8_input: bool,
) -> None:
    """The epilogue state of every fused FP8 layer: the bias as the fp16 engine and
    torch._scaled_mm's epilogue hold it (the engine's dtype), kept in float32; the activation;
    the engine's dtype; the FP8 hand-off (`quant/rewrites/handoff.py`): `out_scale` writes the next
    layer's FP8 input, `fp8_input` reads its own already quantized by the layer before."""
    bias = layer.bias.detach().to(dtype).float() if layer.bias is not None else None
    module.register_buffer("bias", bias)
    module.act = act
    module.dtype = dtype
    out = torch.tensor(out_scale, dtype=torch.float32) if out_scale is not None else None
    module.register_buffer("out_scale", out)
    module.fp8_input = fp8_input


def handed_input(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The FP8 input a hand-off gave `module`, refused in any other dtype."""
    if x.dtype != E4M3:
        raise TypeError(f"this layer reads FP8 from the layer before, got {x.dtype}")
    return x


def io_repr(module: nn.Module) -> str:
    """ ", fp8 in" / ", fp8 out" for a fused layer's hand-offs, for `extra_repr`."""
    return (", fp8 in" if module.fp8_input else "") + (
        ", fp8 out" if module.out_scale is not None else ""
    )


class FusedFP8Matmul(PointwiseMatmul):
    """A 1x1 conv or linear layer as one fused FP8 product (see the module docstring).

    Same quantization as `FP8Matmul` (static per-tensor activation scale, per-channel or
    per-tensor FP8 weights from the float32 layer); the bias and scales stay float32. K is
    zero-padded to a multiple of 16 (the weight once, the activation inside its quantize, which
    Inductor fuses into the producer): FP8 rows of 728 bytes (xception41) cannot be read with
    16-byte vector or descriptor loads, and those products ran several times slower than
    cuBLASLt on padded ones (docs/fp8-kernel.md). Zero columns add exact zeros to every sum.
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d, spec: FP8LayerSpec) -> None:
        super().__init__()
        x_scale, per_channel = spec.static_scale("FusedFP8Matmul"), spec.per_channel
        dtype, act, out_scale, fp8_input = spec.dtype, spec.act, spec.out_scale, spec.fp8_input
        fp8_weight, row_scales, x_divisor = spec.weight, spec.row_scales, spec.x_divisor
        self._take_shape(layer, dtype)
        weight = layer.weight.detach().float()
        weight = weight.reshape(weight.shape[0], -1)
        w8, w_scale = fp8_weight or quantize_weight(weight, per_channel)
        w8 = w8.reshape(weight.shape)
        self.k_pad = align(weight.shape[1]) - weight.shape[1]
        w8 = F.pad(w8.float(), (0, self.k_pad)).to(w8.dtype)  # exact: FP8 zeros
        self.register_buffer("w8", w8.contiguous())
        self.register_buffer("w_scale", w_scale.expand(weight.shape[0]).contiguous())
        self._take_input_quant(x_scale, row_scales, x_divisor, self.k_pad)
        take_epilogue(self, layer, dtype, act, out_scale, fp8_input)
        self.promote = spec.promote  # how the products sum (`record/build_spec.py`)
        # The activation after a residual sum in the epilogue; None: no residual (set by
        # `quant/rewrites/residual.py` when it moves a block's add into this layer).
        self.res_act: str | None = None
        # The next FP8 layer's input scale where this layer also writes that layer's FP8
        # input beside its own output (a residual sum with two readers,
        # `quant/rewrites/residual.py`).
        self.register_buffer("pair_scale", None)
        # The zero padding of the conv that alone reads this layer's output, written here
        # around the output (`quant/rewrites/pad_handoff.py`); None: a plain output.
        self.out_pad: OutputPad | None = None
        if fp8_input and self.k_pad:
            raise ValueError("an FP8 input cannot be padded here: its producer writes K columns")
        if fp8_input and (row_scales or x_divisor is not None):
            raise ValueError("an FP8 input from the layer before has its static per-tensor scale")

    def _operand(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The kernel's input, its scale and the migration divisor's reciprocal where the
        kernel quantizes the input itself."""
        if self.fp8_input:
            return handed_input(self, x2d), self.x_scale, None
        if self.row_scales and self.pair_scale is None:  # quantized in the kernel
            return x2d, self.x_scale, self.x_inv_divisor
        if self.k_pad:
            x2d = F.pad(x2d, (0, self.k_pad))
        return (*self._quantize_input(x2d), None)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.out_pad is None:
            return super().forward(x, residual)
        if residual is not None or self.out_scale is not None or self.pair_scale is not None:
            raise ValueError("a padded output is the layer's own, without residual or FP8 write")
        x = self._subsampled(x)
        b, _, h, w = x.shape
        xq, x_scale, divisor = self._operand(self._rows(x))
        y = fp8_gemm_padded(
            xq, self.w8, self.w_scale, x_scale, self.bias, self.act, self.dtype, self.dtype,
            divisor, [b, h, w], list(self.out_pad.pads(h, w)), self.promote,
        )  # fmt: skip
        return y.permute(0, 3, 1, 2)

    def _matmul(self, x2d: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if (residual is None) != (self.res_act is None):
            raise ValueError("a residual layer takes its residual, and no other layer takes one")
        xq, x_scale, divisor = self._operand(x2d)
        if self.pair_scale is not None:
            return fp8_gemm_pair(
                xq, self.w8, self.w_scale, x_scale, self.bias, self.act, self.dtype,
                self.pair_scale, self.dtype, residual, self.res_act or Activation.NONE,
                self.promote,
            )  # fmt: skip
        out_dtype = E4M3 if self.out_scale is not None else self.dtype
        return fp8_gemm(
            xq,
            self.w8,
            self.w_scale,
            x_scale,
            self.bias,
            self.act,
            out_dtype,
            self.out_scale,
            self.dtype,
            residual,
            self.res_act or Activation.NONE,
            divisor,
            self.promote,
        )

    def extra_repr(self) -> str:
        k = self.w8.shape[1] - self.k_pad
        res = f", + residual, {self.res_act}" if self.res_act is not None else ""
        res += ", and fp8 out" if self.pair_scale is not None else ""
        res += f", padded out {self.out_pad}" if self.out_pad is not None else ""
        head = f"n={self.w8.shape[0]}, k={k}, k_pad={self.k_pad}, act={self.act}"
        return head + io_repr(self) + res
