"""What each built engine is: dtype, compilation, which layers ran real FP8."""

from __future__ import annotations

from pydantic import Field

from quantstudy.record.base import Section
from quantstudy.record.vocab import CompileMode, Fp8Kernel


class LayerKernel(Section):
    """Which product one real FP8 layer runs, and the in-place timings that chose it
    (`engines/kernel_choice.py`; schema 6 on)."""

    name: str
    kernel: Fp8Kernel  # "fused" or "scaled_mm"
    fused_us: float | None = None  # None: not timed (see why)
    scaled_mm_us: float | None = None
    batch: int | None = None  # the batch size the layer was timed at
    why: str | None = None  # why it was not timed (FP8 hand-off, kxk conv, not on CUDA)


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
    fp8_kernel: Fp8Kernel | None = None
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
    # rewrite -> why it was not applied to this model: a rewrite that cannot trace the model
    # is skipped, never fatal ("residual": `quant/rewrites/residual.py`; schema 16 on)
    fp8_rewrites_skipped: dict[str, str] = Field(default_factory=dict)
    fp16_layers: int  # conv/linear layers left in the engine's compute dtype
    weight_bytes: int
    numerics: dict[str, str]  # explicit global settings, e.g. {"allow_tf32": "False"}
