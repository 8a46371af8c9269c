"""A real FP8 layer that steps aside: replaced by its float layer where FP8 cannot win
(timed by `engines/kernel_choice.py`; why some layers lose: docs/fp8-kernel.md).

The float layer is the fp16 engine's, in the engine's dtype, with the FP8 layer's epilogue as
separate ops (`engines/layer_timing.py: fp16_side`). Assumes the layer neither writes nor reads
a hand-off: its neighbour depends on that buffer, so `fp16_blocker` refuses it.

The rule (`steps_aside`): faster by more than `MARGIN` at every timed batch, since the float
layer computes other numbers and quality must not depend on the batch the images pass through.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

MARGIN = 0.03
"""A kernel must take less than (1 - MARGIN) of the other's time to replace it."""


def fp16_blocker(layer: nn.Module) -> str | None:
    """Why the real FP8 `layer` cannot step aside (module docstring); None when it can."""
    if getattr(layer, "out_pad", None) is not None:
        return "writes the next conv's padded input"
    if layer.fp8_input or layer.out_scale is not None:
        return "FP8 hand-off"
    if getattr(layer, "pair_scale", None) is not None:
        return "writes the next layer's FP8 input beside its sum"
    return None


def steps_aside(fp16_us: Sequence[float | None], fp8_us: Sequence[float]) -> bool:
    """Whether a layer steps aside, given its float layer's and its best FP8 kernel's times at
    each timed batch: faster by more than `MARGIN` at every one (module docstring)."""
    pairs = list(zip(fp16_us, fp8_us, strict=True))
    return bool(pairs) and all(h is not None and h < (1 - MARGIN) * t for h, t in pairs)
