"""The cuBLASLt backend: cuBLASLt's FP8 product per real FP8 linear or 1x1 conv, with the
layer's epilogue in cuBLASLt's own: the bias, GELU (cuBLASLt's is the tanh form) or ReLU with
the bias, the residual stream as C, the FP8 write scaled for the next layer
(`quant/cublaslt/`, docs/cublaslt.md). A layer whose epilogue cuBLASLt has no form for (another
activation, an activation after the residual sum, two outputs) runs the fused kernel instead,
and says so (`LtFP8Matmul.lt_answer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantstudy.quant.backends.base import Alignment, Availability, Backend, Product, Support
from quantstudy.record.vocab import Activation, Epilogue, GeluPolicy, ProductOp

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantstudy.quant.layers.spec import FP8LayerSpec
    from quantstudy.record.build_spec import BuildSpec


class CublasLtBackend(Backend):
    name = "cublaslt"
    summary = (
        "cuBLASLt's FP8 product per real FP8 layer with the layer's epilogue in cuBLASLt's own "
        "(bias; GELU, tanh form, or ReLU with the bias; the residual as C; the FP8 write for "
        "the next layer), per-channel weight scales as a device alpha vector"
    )
    support = Support(
        ops=frozenset({ProductOp.LINEAR, ProductOp.CONV1X1}),
        epilogues=frozenset(
            {Epilogue.BIAS, Epilogue.ACTIVATION, Epilogue.RESIDUAL, Epilogue.FP8_OUTPUT}
        ),
        out_dtypes=frozenset({"float16", "bfloat16", "float8_e4m3fn"}),
        activations=frozenset({Activation.GELU, Activation.RELU}),
        alignment=Alignment(k=16, n=16, pads=False),  # FP8 rows and D's rows: 16-byte aligned
    )
    bench_label = "cuBLASLt epilogue"
    takes_fused = True  # `LtFP8Matmul` keeps the fused layer's state and replaces its launch

    def availability(self) -> Availability:
        from quantstudy.quant.cublaslt.library import unavailable

        why = unavailable()
        return why is None, why or ""

    def build_layer(self, layer: nn.Module, spec: FP8LayerSpec, build: BuildSpec) -> nn.Module:
        """`LtFP8Matmul`: the fused layer's quantization and state, launched through cuBLASLt;
        dynamic per-row input scales are refused (cuBLASLt's plain FP8 scaling is per tensor)."""
        from quantstudy.quant.layers.lt_matmul import LtFP8Matmul

        spec.refuse("LtFP8Matmul", "row_scales", "x_divisor")
        return LtFP8Matmul(layer, spec)

    def runs_own_kernel(self, fused: nn.Module, gelu: GeluPolicy) -> bool:
        """Whether cuBLASLt has a form for the epilogue of the fused linear or 1x1 conv `fused`
        under `gelu` (`lt_matmul.lt_plan_of`, from its state: nothing is copied)."""
        from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
        from quantstudy.quant.layers.lt_matmul import lt_plan_of

        if not isinstance(fused, FusedFP8Matmul):
            return False
        return lt_plan_of(fused, GeluPolicy(gelu) == GeluPolicy.ERF)[0] is not None

    def from_fused(self, fused: nn.Module, gelu: GeluPolicy) -> nn.Module | None:
        """`LtFP8Matmul.of_fused`: the fused linear or 1x1 conv `fused` launched through
        cuBLASLt with its epilogue; None where cuBLASLt has no form for that epilogue under
        `gelu` (`runs_own_kernel`: the layer would run the fused kernel)."""
        from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
        from quantstudy.quant.layers.lt_matmul import LtFP8Matmul

        if not isinstance(fused, FusedFP8Matmul) or not self.runs_own_kernel(fused, gelu):
            return None
        return LtFP8Matmul.of_fused(fused, gelu)

    def output_note(self, model: nn.Module) -> str | None:
        """Which layers cuBLASLt's epilogues ran and which GELU they computed, which fell back
        to the fused kernel and why: the record's per-layer answer, in words."""
        from quantstudy.quant.layers.lt_matmul import lt_note

        return lt_note(model)

    def launch(self, product: Product) -> torch.Tensor:
        """One cuBLASLt product with its epilogue (`quantstudy::lt_linear`), what `bench
        products` times: per-channel scales as the alpha vector, the bias in fp16."""
        import torch

        from quantstudy.quant.cublaslt.op import lt_linear
        from quantstudy.quant.cublaslt.problem import epilogue_for

        p = product
        if p.promote not in (0, 128):
            raise ValueError(f"cuBLASLt sums fast or promotes per K tile, not every {p.promote}")
        epilogue, why = epilogue_for(True, p.act, False, p.out_scale is not None)
        if epilogue is None:
            raise ValueError(why)
        n = p.w8.shape[0]
        alpha = (p.w_scale.float().expand(n) * p.x_scale.float()).contiguous()
        bias = p.bias if p.bias is not None else torch.zeros(n, device=p.w8.device)
        half = torch.bfloat16 if p.out_dtype == torch.bfloat16 else torch.float16
        d_scale = None if p.out_scale is None else (1.0 / p.out_scale.float()).reshape(1)
        return lt_linear(
            p.xq.contiguous(), p.w8.contiguous(), alpha, p.x_scale.float().reshape(1),
            bias.to(half), None, d_scale, epilogue.value, p.promote == 0,
            p.out_scale is not None, True,
        )  # fmt: skip


BACKEND = CublasLtBackend()
