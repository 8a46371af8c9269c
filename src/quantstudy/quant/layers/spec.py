"""What an FP8 layer is built from, beside the float layer it replaces: one frozen value.

The four FP8 layer modules (`FP8Matmul`, `FusedFP8Matmul`, `FusedFP8Conv2d`,
`FusedFP8Depthwise`) and the quantize-dequantize emulation `QDQ` take the float layer and an
`FP8LayerSpec`, so the plan states each layer's quantization once, by name, and a module that
cannot honour a field refuses it instead of dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantstudy.record.vocab import Activation, GeluPolicy


@dataclass(frozen=True)
class FP8LayerSpec:
    """One layer's quantization.

    `x_scale`: the static per-tensor input scale (None: the input stays unquantized, `QDQ`'s
    weight-only runs). `per_channel`: one weight scale per output channel (else per tensor).
    `dtype`: the engine's dtype (fp16, bf16; float32 for the emulation). `act`: the activation
    the epilogue computes (`rewrites/absorb.py`). `out_scale`: the next FP8 layer's input scale,
    given when this layer writes that input already quantized (a hand-off); `fp8_input`: this
    layer reads its own input that way. `weight`: the plan's stored FP8 weight and scale (None:
    rounded to nearest here). `row_scales`, `x_divisor`: dynamic per-row input scales and the
    migration divisor (`QuantPlan.input_quant`). `promote`: how many products the tensor cores
    sum before float32 takes over (0: all of K), the engine's `BuildSpec.promote`. `gelu`: the
    GELU forms the recipe allows (`GeluPolicy`; a backend whose GELU epilogue is another form
    than erf takes a GELU only under `any`)."""

    x_scale: float | None
    per_channel: bool
    dtype: torch.dtype
    act: Activation = Activation.NONE
    out_scale: float | None = None
    fp8_input: bool = False
    weight: tuple[torch.Tensor, torch.Tensor] | None = None
    row_scales: bool = False
    x_divisor: torch.Tensor | None = None
    promote: int = 0
    gelu: GeluPolicy = GeluPolicy.ANY

    def __post_init__(self) -> None:
        object.__setattr__(self, "act", Activation(self.act))  # a misspelt name fails here
        object.__setattr__(self, "gelu", GeluPolicy(self.gelu))

    def refuse(self, module: str, *fields: str) -> None:
        """Raise if any of `fields` differs from its default: `module` cannot honour it."""
        defaults = FP8LayerSpec(None, True, torch.float32)
        given = [f for f in fields if not _is_default(getattr(self, f), getattr(defaults, f))]
        if given:
            raise ValueError(f"{module} does not take {', '.join(given)}")

    def static_scale(self, module: str) -> float:
        """`x_scale`, which `module` needs (only `QDQ` runs without one)."""
        if self.x_scale is None:
            raise ValueError(f"{module} needs a static input scale")
        return self.x_scale


def _is_default(value: object, default: object) -> bool:
    return value is None if default is None else value == default
