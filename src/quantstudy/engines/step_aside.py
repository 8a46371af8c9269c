"""A real FP8 layer that steps aside: kept in the engine's dtype where FP8 cannot win.

Why: FP8 pays only where its product saves more than its quantize and scales cost, and on some
layers it does not: the FP8 implicit-GEMM kxk conv loses to cuDNN's fp16 convs on ResNet-50,
and the transformer linears of a batch-1 ViT lose to cuBLAS fp16 (docs/fp8-kernel.md, "The
per-layer kernel choice"). Under `--fp8-kernel fastest` each such layer is timed in place
against its float layer (`engines/kernel_choice.py`) and, where the float layer wins, the
engine runs it instead, so the compiled engine calls cuDNN/cuBLAS there.

What the fp16 side is: the layer as the fp16 engine holds it (`builders.deployed_copy` of the
model, BatchNorm folded when the recipe folds, no bias correction or fitting: those answer
an FP8 weight rounding this layer no longer does), in the engine's dtype, channels-last,
followed by what the FP8 layer computes in its epilogue (`engines/unfused.py`). Its padding is
the float layer's own: the FP8 layer was built from the same layer with the same padding, and
where a producer writes the zero padding around its output (`quant/rewrites/pad_handoff.py`) the
padding was a module of its own (`nn.ZeroPad2d`, or a `Conv2dSame`, which is never an FP8 layer
here), so a conv after it has padding 0 in the model as in the engine, and the float conv with
padding 0 on the padded buffer computes what the model computes on the unpadded one.

Which layers may step aside: those whose input and output are plain tensors in the engine's
dtype. A layer that writes a hand-off (the next layer's FP8 input, an FP8 copy of its residual
sum, a padded output) cannot: its reader depends on that buffer. Nor can a layer that reads an
FP8 hand-off: as a float layer it would read an input its producer still quantizes, which no
emulation of the recipe computes. So a "fastest" engine is timed where no layer hands off, and
assembled after the choice with hand-offs among the layers that stay FP8 only
(`engines/fp8_assembly.py`); `fp16_blocker` refuses a layer named or replayed that is tied anyway.

The rule: a layer steps aside only where its float layer is faster than its best FP8 kernel by
more than `MARGIN` at EVERY timed batch. A layer that loses at some batches only stays FP8 (the
record shows its timings): unlike the two FP8 products, the float layer computes other numbers,
and a layer that switched between them by batch would make the engine's quality depend on the
batch the held-out images pass through, which is not the batch that was timed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from quantstudy.engines.base import in_memory_format
from quantstudy.engines.unfused import Unfused

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


def float_layer(
    plain: nn.Module, name: str, fused: nn.Module, dtype: torch.dtype, device: torch.device
) -> Unfused:
    """The float layer `name` of `plain` (the fp16 engine's model, float32) in `dtype` on
    `device`, channels-last, with the epilogue of the FP8 layer `fused` it replaces."""
    layer = copy.deepcopy(plain.get_submodule(name)).to(device, dtype)
    return Unfused.like(in_memory_format(layer, torch.channels_last), fused)


def steps_aside(fp16_us: Sequence[float | None], fp8_us: Sequence[float]) -> bool:
    """Whether a layer steps aside, given its float layer's and its best FP8 kernel's times at
    each timed batch: faster by more than `MARGIN` at every one (module docstring)."""
    pairs = list(zip(fp16_us, fp8_us, strict=True))
    return bool(pairs) and all(h is not None and h < (1 - MARGIN) * t for h, t in pairs)
