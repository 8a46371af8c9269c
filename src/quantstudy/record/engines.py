"""What each built engine is: dtype, compilation, which layers ran real FP8 and how."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from quantstudy.record.base import Section
from quantstudy.record.vocab import FASTEST, CompileMode, Engine, GeluForm

# What a kernel choice names a layer kept in its float layer (stepped aside), beside the FP8
# backends' names (`quant/backends/`).
FP16 = Engine.FP16.value
# The timings of records before schema 23, one field per kernel, read into `LayerKernel.us`.
_TIMING_FIELDS = {"fused_us": "fused", "scaled_mm_us": "scaled_mm", "fp16_us": FP16}


class LayerKernel(Section):
    """What one real FP8 layer runs at one timed batch, and the in-place timings that chose it
    (`engines/kernel_choice.py`; schema 6 on, "fp16" schema 17 on, `us` schema 23 on)."""

    name: str
    kernel: str  # an FP8 backend's name (`quant/backends/`), or "fp16" (stepped aside)
    # microseconds by backend name, and "fp16" for the float layer with its epilogue in the
    # engine's dtype; a name absent: not timed (see why; no such kernel for the layer, an FP8
    # hand-off)
    us: dict[str, float] = Field(default_factory=dict)
    batch: int | None = None  # the batch size the layer was timed at
    why: str | None = None  # why it was not timed (FP8 hand-off, not on CUDA)

    @model_validator(mode="before")
    @classmethod
    def _one_field_per_kernel(cls, data: Any) -> Any:
        """A row of a record before schema 23: `fused_us`, `scaled_mm_us`, `fp16_us` into `us`."""
        if not isinstance(data, dict) or not any(k in data for k in _TIMING_FIELDS):
            return data
        us = dict(data.get("us") or {})
        for key, name in _TIMING_FIELDS.items():
            if data.get(key) is not None:
                us[name] = data[key]
        return {k: v for k, v in data.items() if k not in _TIMING_FIELDS} | {"us": us}

    @property
    def fused_us(self) -> float | None:
        return self.us.get("fused")

    @property
    def scaled_mm_us(self) -> float | None:
        return self.us.get("scaled_mm")

    @property
    def fp16_us(self) -> float | None:
        return self.us.get(FP16)


def stepped_aside(choice: list[LayerKernel]) -> list[str]:
    """The layers a kernel choice keeps in the engine's dtype ("fp16" rows), in its order."""
    return list(dict.fromkeys(c.name for c in choice if c.kernel == FP16))


class KernelChoice(Section):
    """How a fused FP8 engine picks each real layer's kernel (`--fp8-kernel fastest`): timed in
    place at `batches` (`engines/kernel_choice.py`), or `replay` of a recorded choice, nothing
    timed (`quantstudy extend`, the float32 engine). Exactly one of the two."""

    batches: tuple[int, ...] = ()
    replay: tuple[LayerKernel, ...] | None = None

    @model_validator(mode="after")
    def _timed_or_replayed(self) -> Self:
        if bool(self.batches) == (self.replay is not None):
            raise ValueError("a kernel choice is timed at some batches or replays a choice")
        return self

    @classmethod
    def timed(cls, batches: tuple[int, ...] | list[int]) -> KernelChoice:
        return cls(batches=tuple(sorted(set(batches))))

    @classmethod
    def replayed(cls, rows: list[LayerKernel]) -> KernelChoice:
        return cls(replay=tuple(rows))


class FP8Layout(Section):
    """How an FP8 engine's real layers were assembled (`engines/builders.py: build_fp8`): one
    section, written by the build and read unchanged by the emulations, `quantstudy extend`, the
    package and the report; empty for an engine that is not an FP8 one. `EngineInfo.layout` in
    code, written flat in study.json as every schema wrote it, each field `fp8_<field>`."""

    # Which FP8 backend built the real layers (`quant/backends/`): "fused" (Triton on CUDA,
    # torch on CPU), "scaled_mm" (torch._scaled_mm plus a separate cast/bias pass), ...; None:
    # no real FP8 layer.
    kernel: str | None = None
    epilogue: dict[str, str] = Field(default_factory=dict)  # layer -> absorbed activation
    # producer -> consumer: the producer writes the consumer's FP8 input (schema 4 on)
    handoff: dict[str, str] = Field(default_factory=dict)
    # layer -> activation after the residual sum its epilogue computes ("none"; schema 8 on)
    residual: dict[str, str] = Field(default_factory=dict)
    # sum layer -> the next FP8 layer whose input it also writes (schema 8 on)
    sum_handoff: dict[str, str] = Field(default_factory=dict)
    # fused 1x1 conv -> the conv whose zero padding it writes around its output (schema 12 on)
    padded_output: dict[str, str] = Field(default_factory=dict)
    # "scaled_mm" engines: the output torch._scaled_mm wrote, e.g. "float16, bias in its
    # epilogue" (`quant.layers.matmul.scaled_mm_output`); None otherwise (schema 5 on)
    scaled_mm_output: str | None = None
    # engines of a `KernelChoice`: the product each real FP8 layer runs and why (schema 6 on)
    kernel_choice: list[LayerKernel] | None = None
    # selected layers kept in the engine's compute dtype because FP8 was slower at every timed
    # batch: the rows of `kernel_choice` with kernel "fp16"; not real FP8 (schema 17 on)
    stepped_aside: list[str] = Field(default_factory=list)
    # rewrite -> why it was not applied to this model: a rewrite that cannot trace the model
    # is skipped, never fatal ("residual": `quant/rewrites/residual.py`; schema 16 on)
    rewrites_skipped: dict[str, str] = Field(default_factory=dict)
    # layer -> the GELU it computes, erf or tanh (cuBLASLt's GELU epilogue), for every layer of
    # `epilogue` whose activation is GELU; the emulation computes the same form on each
    # (`quant/layers/gelu.py`). Empty before schema 27: erf, but where a cuBLASLt note of
    # `scaled_mm_output` names the layer's GELU tanh (version 27)
    gelu: dict[str, GeluForm] = Field(default_factory=dict)

    @property
    def tanh_gelu(self) -> list[str]:
        """The layers whose GELU is the tanh form, by name."""
        return sorted(n for n, form in self.gelu.items() if form == GeluForm.TANH)

    @model_validator(mode="after")
    def _stepped_aside_is_the_choice(self) -> Self:
        """The stepped-aside list is the kernel choice's "fp16" layers."""
        if stepped_aside(self.kernel_choice or []) != self.stepped_aside:
            raise ValueError("fp8_stepped_aside must list the layers the kernel choice ran fp16")
        return self

    @property
    def kernel_option(self) -> str | None:
        """What `--fp8-kernel` named: the kernel, or "fastest" for a choice per layer; None:
        no real FP8 layer."""
        if self.kernel is None:
            return None
        return FASTEST if self.kernel_choice is not None else self.kernel

    def replay(self) -> KernelChoice | None:
        """This engine's choice, to build it again without timing; None: it made none."""
        return None if self.kernel_choice is None else KernelChoice.replayed(self.kernel_choice)


# The layout's fields as study.json holds them: flat in `EngineInfo`, each `fp8_<field>`.
_FLAT = tuple(f"fp8_{name}" for name in FP8Layout.model_fields)


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
    layout: FP8Layout = Field(default_factory=FP8Layout)  # how the real FP8 layers were built
    fp16_layers: int  # conv/linear layers left in the engine's compute dtype
    weight_bytes: int
    numerics: dict[str, str]  # explicit global settings, e.g. {"allow_tf32": "False"}

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, data: Any) -> Any:
        """The flat `fp8_<field>` keys of study.json as the `layout`; `fp8_kernel`
        "fastest" (before schema 18) as what it built: the fused kernel, chosen per layer."""
        if not isinstance(data, dict) or not any(k in data for k in _FLAT):
            return data
        flat = {k.removeprefix("fp8_"): v for k, v in data.items() if k in _FLAT}
        if flat.get("kernel") == FASTEST:
            flat["kernel"] = "fused"  # what every "fastest" engine then was built with
        rest = {k: v for k, v in data.items() if k not in _FLAT}
        return rest | {"layout": flat}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written flat, as read (`_nested`): the layout's fields as `fp8_<field>` keys."""
        data: dict[str, Any] = handler(self)
        layout = data.pop("layout", None) or {}
        return data | {f"fp8_{key}": value for key, value in layout.items()}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update`, which may name the layout's fields flat, as study.json does."""
        if update and any(k in update for k in _FLAT):
            flat = {k.removeprefix("fp8_"): v for k, v in update.items() if k in _FLAT}
            rest = {k: v for k, v in update.items() if k not in _FLAT}
            update = rest | {"layout": self.layout.model_copy(update=flat)}
        return super().model_copy(update=update, deep=deep)

    @model_validator(mode="after")
    def _stepped_aside_is_not_real(self) -> Self:
        if set(self.layout.stepped_aside) & set(self.fp8_real):
            raise ValueError("a layer stepped aside to fp16 runs no real FP8 product")
        return self
