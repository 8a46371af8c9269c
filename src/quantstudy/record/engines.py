"""What each built engine is: dtype, compilation, which layers ran real FP8."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from quantstudy.record.base import Section
from quantstudy.record.vocab import ChosenKernel, CompileMode, FP8Kernel


class LayerKernel(Section):
    """What one real FP8 layer runs at one timed batch, and the in-place timings that chose it
    (`engines/kernel_choice.py`; schema 6 on, "fp16" and `fp16_us` schema 17 on)."""

    name: str
    kernel: ChosenKernel  # "fused", "scaled_mm" or "fp16" (stepped aside: the float layer)
    fused_us: float | None = None  # None: not timed (see why)
    scaled_mm_us: float | None = None  # None: not timed (no unfused kernel for the layer)
    # the float layer and its epilogue in the engine's dtype; None: not timed (an FP8 hand-off)
    fp16_us: float | None = None
    batch: int | None = None  # the batch size the layer was timed at
    why: str | None = None  # why it was not timed (FP8 hand-off, not on CUDA)


class EngineInfo(Section):
    name: str  # "fp32", "fp16", "fp8", "fakequant", "fakequant_weights", ...
    compute_dtype: str
    device: str
    compiled: bool
    compile_mode: CompileMode | None = None
    cuda_graphs: bool = False
    channels_last: bool = False
    fp8_real: list[str]  # layers running a real FP8 matrix product
    fp8_emulated: list[str]  # layers quantized but computed by quantize-dequantize
    # Which FP8 product ran the real layers: "fused" (Triton on CUDA, torch on CPU) or
    # "scaled_mm" (torch._scaled_mm plus a separate cast/bias pass); None: no real FP8 layer.
    fp8_kernel: FP8Kernel | None = None
    fp8_epilogue: dict[str, str] = Field(default_factory=dict)  # layer -> absorbed activation
    # producer -> consumer: the producer writes the consumer's FP8 input (schema 4 on)
    fp8_handoff: dict[str, str] = Field(default_factory=dict)
    # layer -> activation after the residual sum its epilogue computes ("none"; schema 8 on)
    fp8_residual: dict[str, str] = Field(default_factory=dict)
    # sum layer -> the next FP8 layer whose input it also writes (schema 8 on)
    fp8_sum_handoff: dict[str, str] = Field(default_factory=dict)
    # fused 1x1 conv -> the conv whose zero padding it writes around its output (schema 12 on)
    fp8_padded_output: dict[str, str] = Field(default_factory=dict)
    # "scaled_mm" engines: the output torch._scaled_mm wrote, e.g. "float16, bias in its
    # epilogue" (`quant.layers.matmul.scaled_mm_output`); None otherwise (schema 5 on)
    fp8_scaled_mm_output: str | None = None
    # "fastest" engines: the product each real FP8 layer runs and why (schema 6 on)
    fp8_kernel_choice: list[LayerKernel] | None = None
    # selected layers a "fastest" engine kept in its compute dtype because FP8 was slower at
    # every timed batch: the rows of `fp8_kernel_choice` with kernel "fp16"; not in `fp8_real`,
    # counted in `fp16_layers` (schema 17 on)
    fp8_stepped_aside: list[str] = Field(default_factory=list)
    # rewrite -> why it was not applied to this model: a rewrite that cannot trace the model
    # is skipped, never fatal ("residual": `quant/rewrites/residual.py`; schema 16 on)
    fp8_rewrites_skipped: dict[str, str] = Field(default_factory=dict)
    fp16_layers: int  # conv/linear layers left in the engine's compute dtype
    weight_bytes: int
    numerics: dict[str, str]  # explicit global settings, e.g. {"allow_tf32": "False"}

    @model_validator(mode="after")
    def _stepped_aside_is_the_choice(self) -> Self:
        """The stepped-aside list is the kernel choice's "fp16" layers, none of them real FP8."""
        chosen = [c.name for c in self.fp8_kernel_choice or [] if c.kernel == ChosenKernel.FP16]
        if list(dict.fromkeys(chosen)) != self.fp8_stepped_aside:
            raise ValueError("fp8_stepped_aside must list the layers the kernel choice ran fp16")
        if set(self.fp8_stepped_aside) & set(self.fp8_real):
            raise ValueError("a layer stepped aside to fp16 runs no real FP8 product")
        return self
