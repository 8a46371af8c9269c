"""The scaled_mm backend: `torch._scaled_mm` (cuBLASLt on CUDA) per real FP8 layer, the bias in
its epilogue where the device's torch takes it, the activation a separate pass
(`quant/layers/matmul.py: FP8Matmul`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from quantstudy.env.machine import torch_version
from quantstudy.quant.backends.base import Alignment, Availability, Backend, Product, Support
from quantstudy.record.vocab import Activation, Epilogue, ProductOp

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantstudy.quant.layers.spec import FP8LayerSpec
    from quantstudy.record.build_spec import BuildSpec


class ScaledMMBackend(Backend):
    name = "scaled_mm"
    summary = (
        "torch._scaled_mm (cuBLASLt on CUDA) per real FP8 layer, writing the engine's dtype "
        "with the bias in its epilogue where the device's torch._scaled_mm supports that (bf16, "
        "biased after, where it does not), activated by the engine's other kernels"
    )
    support = Support(
        ops=frozenset({ProductOp.LINEAR, ProductOp.CONV1X1}),
        epilogues=frozenset({Epilogue.BIAS}),
        out_dtypes=frozenset({"float16", "bfloat16", "float32"}),
        alignment=Alignment(k=16, n=16, pads=True),  # both zero-padded: weight once, input in
    )  # its quantize

    def availability(self) -> Availability:
        import torch

        if not hasattr(torch, "_scaled_mm"):
            return False, f"torch {torch_version()} has no _scaled_mm"
        return True, ""

    def build_layer(self, layer: nn.Module, spec: FP8LayerSpec, build: BuildSpec) -> nn.Module:
        """`FP8Matmul`: the product and bias alone (no activation, hand-off or residual)."""
        from quantstudy.quant.layers.matmul import FP8Matmul

        return FP8Matmul(layer, replace(spec, act=Activation.NONE, out_scale=None, fp8_input=False))

    def bind(self, model: nn.Module, device: torch.device) -> None:
        from quantstudy.quant.layers.matmul import bind_scaled_mm

        bind_scaled_mm(model, device)

    def output_note(self, model: nn.Module) -> str | None:
        from quantstudy.quant.layers.matmul import scaled_mm_output_of

        return scaled_mm_output_of(model)

    def launch(self, product: Product) -> torch.Tensor:
        """`torch._scaled_mm` with per-tensor scales (the first of `w_scale`), K and N
        zero-padded to 16, the bias in its epilogue (fp16), the output sliced back to N."""
        import torch
        import torch.nn.functional as F

        p = product
        if p.act != Activation.NONE or p.out_scale is not None:
            raise ValueError("scaled_mm computes no activation or FP8 output in its epilogue")
        k, n = p.xq.shape[1], p.w8.shape[0]
        kp, np_ = -k % 16, -n % 16
        a8 = F.pad(p.xq.float(), (0, kp)).to(p.xq.dtype) if kp else p.xq
        w8 = F.pad(p.w8.float(), (0, kp, 0, np_)).to(p.w8.dtype) if kp or np_ else p.w8
        bias = None if p.bias is None else F.pad(p.bias, (0, np_)).to(p.out_dtype)
        y = torch._scaled_mm(
            a8, w8.t(), scale_a=p.x_scale, scale_b=p.w_scale.reshape(-1)[0], bias=bias,
            out_dtype=p.out_dtype, use_fast_accum=p.promote == 0,
        )  # fmt: skip
        return y[:, :n]


BACKEND = ScaledMMBackend()
