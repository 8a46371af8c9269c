"""The fused backend: one Triton kernel per real FP8 layer (product, scales, bias, activation,
residual sum and the next layer's FP8 input in its epilogue); off CUDA the same arithmetic in
torch (`quant/layers/fused_matmul.py`, `fused_conv.py`, `fused_depthwise.py`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from quantstudy.quant.backends.base import Alignment, Availability, Backend, Product, Support
from quantstudy.record.vocab import Activation, Epilogue, ProductOp

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantstudy.quant.layers.spec import FP8LayerSpec
    from quantstudy.record.build_spec import BuildSpec


class FusedBackend(Backend):
    name = "fused"
    summary = (
        "one fused kernel per real FP8 layer (Triton on CUDA, the same arithmetic in torch "
        "elsewhere): FP8 operands, float32 sums, per-channel scale, folded-BatchNorm bias and "
        "any absorbed activation applied before one write"
    )
    support = Support(
        ops=frozenset(ProductOp),
        epilogues=frozenset(Epilogue),
        out_dtypes=frozenset({"float16", "bfloat16", "float32", "float8_e4m3fn"}),
        activations=frozenset(a for a in Activation if a != Activation.NONE),
        alignment=Alignment(k=16, pads=True),  # FP8 rows of 16-byte multiples: K zero-padded
    )

    def availability(self) -> Availability:
        return True, ""  # off CUDA its layers compute in torch

    def build_layer(self, layer: nn.Module, spec: FP8LayerSpec, build: BuildSpec) -> nn.Module:
        """`FusedFP8Depthwise` (FP8 storage, the plan's stored weight), `FusedFP8Conv2d` (dense
        kxk convs: nearest weights, static per-tensor input) or `FusedFP8Matmul` (linears and
        1x1 convs), each with the fields it computes with."""
        from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
        from quantstudy.quant.layers.fused_depthwise import (
            FusedFP8Depthwise,
            depthwise_fp8_blocker,
        )
        from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
        from quantstudy.quant.layers.matmul import real_fp8_blocker

        if depthwise_fp8_blocker(layer) is None:
            return FusedFP8Depthwise(layer, replace(spec, row_scales=False, x_divisor=None))
        if real_fp8_blocker(layer) is not None:  # a kxk conv
            static = replace(spec, weight=None, row_scales=False, x_divisor=None)
            return FusedFP8Conv2d(layer, static)
        return FusedFP8Matmul(layer, spec)

    def launch(self, product: Product) -> torch.Tensor:
        """`quant/kernels/gemm.py: fp8_gemm_triton`, autotuned (CUDA only)."""
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton

        p = product
        return fp8_gemm_triton(
            p.xq, p.w8, p.w_scale.expand(p.w8.shape[0]).contiguous(), p.x_scale, p.bias,
            p.act, p.out_dtype, out_scale=p.out_scale, round_to=p.round_to, promote=p.promote,
        )  # fmt: skip


BACKEND = FusedBackend()
