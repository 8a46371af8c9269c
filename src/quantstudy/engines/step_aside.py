"""A real FP8 layer that steps aside: replaced by its float layer where FP8 cannot win.

FP8 pays only where the product saves more than its quantize and scales cost; on some layers
it does not (the kxk convs of ResNet-50 against cuDNN fp16, a batch-1 ViT's linears against
cuBLAS fp16: docs/fp8-kernel.md, "The per-layer kernel choice"). `engines/kernel_choice.py`
times each layer against its float layer; where the float layer wins, the engine runs it.

The float layer is the fp16 engine's (`builders.deployed_copy`: BatchNorm folded as the recipe
folds, no FP8 bias correction or fitting, which answer a rounding it no longer does) in the
engine's dtype, channels-last, followed by the FP8 layer's epilogue as separate ops
(`engines/layer_timing.py: fp16_side`). Its padding is the model's own: a padding a producer writes
(`quant/rewrites/pad_handoff.py`) was a module of its own in the model, so the float conv
with padding 0 on the padded buffer computes what the model computes.

Assumes the layer neither writes nor reads a hand-off (docs/DESIGN.md, glossary): its reader
or producer depends on that buffer, so `fp16_blocker` refuses it, and a choice is timed where
no layer hands off (`engines/fp8_assembly.py`).

The rule (`steps_aside`): faster by more than `MARGIN` at EVERY timed batch. The float layer
computes other numbers than FP8, so a choice that changed with the batch would make quality
depend on the batch the held-out images pass through, which is not the one timed.
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
