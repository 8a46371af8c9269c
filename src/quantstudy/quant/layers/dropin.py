"""What an FP8 module shows of the float layer it replaced, so that model code keeps working.

timm's model code reads the attributes of its own layers, not only their outputs: edgenext's and
xcit's `PositionalEncodingFourier.forward` reads `self.token_projection.weight.device` and
`.dtype` on every call, convit and swin v2 read `.weight.dtype` to build buffers, and other code
reads `in_features`, `out_channels` or `kernel_size`. An FP8 module in the layer's place must
answer those reads as the layer would, or the model fails (an AttributeError) or, worse, computes
something else without a word. `DropIn` is the one mechanism every FP8 layer module shares: the
float layer's geometry as read-only properties, and a `weight` that reports what the layer's
weight would report in this engine.

What `weight` is, and why. Model code reads a weight's metadata to place and cast other tensors:
`.device` (where to create a tensor), `.dtype` (what to cast an input to before calling the
layer), `.shape` (sizes). So `weight` is a read-only view with the float layer's shape, on the
module's device, in the engine's compute dtype (fp16/bf16, float32 for the emulation): exactly
what the replaced layer's weight reports in an engine of that dtype, so code that casts its
inputs to `weight.dtype` feeds the FP8 module what the float layer would have been fed. It is
neither of the alternatives:
- the FP8 weight (`w8`, float8_e4m3fn): code that casts an input to `weight.dtype` would round
  the activation to FP8 without a scale (saturating above 448, losing everything below 2^-9)
  and silently change the numerics;
- the dequantized weight: a copy (a multiply and a cast over every weight) on each read, and
  PositionalEncodingFourier reads it on every forward: hot-path work for a value nobody uses.
The view expands one stored NaN (stride 0, no storage of the weight's size, no work per read):
its metadata are right and its values are not a weight. Code that computes with the weight
itself (beit's `F.linear(x, self.qkv.weight, ...)`) bypasses the module, so an FP8 module there
would never run: recipes leave such layers out (`executed: false` in `generic_default`), and
if one is quantized anyway its NaN output shows in the study's non-finite scan instead of
passing for a result. A write into the view fails (its elements share one memory location).

`bias` is each module's own: the float32 bias its epilogue adds (rounded to the engine's dtype,
`fused_matmul.take_epilogue`), or the quantize-dequantize emulation's copy of the layer's bias.
The probe is a plain attribute, not a buffer: it is no part of a checkpoint or of the engine's
weight bytes; `_apply` moves and casts it with the module, as `.to()` would a weight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# The attributes of the replaced layer its FP8 module answers, by kind; `weight` beside them.
LINEAR_ATTRS = ("in_features", "out_features")
CONV_ATTRS = (
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "padding_mode",
)


@dataclass(frozen=True)
class LayerFace:
    """The replaced layer as model code may read it: its kind, weight shape and attributes."""

    kind: str  # "linear" or "conv2d"
    weight_shape: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


def face_of(layer: nn.Module) -> LayerFace:
    """The face of a float `nn.Linear` or `nn.Conv2d` (timm subclasses included)."""
    names: tuple[str, ...]
    if isinstance(layer, nn.Linear):
        kind, names = "linear", LINEAR_ATTRS
    elif isinstance(layer, nn.Conv2d):
        kind, names = "conv2d", CONV_ATTRS
    else:
        raise TypeError(f"an FP8 module replaces a Linear or Conv2d, not {type(layer).__name__}")
    shape = tuple(int(s) for s in layer.weight.shape)
    return LayerFace(kind, shape, {name: getattr(layer, name) for name in names})


def _face_attr(name: str) -> property:
    def get(self: DropIn) -> Any:
        face = self.__dict__.get("_face")
        if face is None or name not in face.attrs:
            kind = face.kind if face is not None else "layer"
            raise AttributeError(f"{type(self).__name__} replaces a {kind}, which has no {name}")
        return face.attrs[name]

    return property(get, doc=f"The replaced layer's `{name}` (read-only).")


class DropIn(nn.Module):
    """Base of every module that replaces a float conv or linear (module docstring). A subclass
    calls `take_face(layer, dtype)` in its `__init__` and sets none of the face's names itself."""

    in_features = _face_attr("in_features")
    out_features = _face_attr("out_features")
    in_channels = _face_attr("in_channels")
    out_channels = _face_attr("out_channels")
    kernel_size = _face_attr("kernel_size")
    stride = _face_attr("stride")
    padding = _face_attr("padding")
    dilation = _face_attr("dilation")
    groups = _face_attr("groups")
    padding_mode = _face_attr("padding_mode")

    def take_face(self, layer: nn.Module, dtype: torch.dtype) -> None:
        """Take `layer`'s face, and a one-element probe in `dtype` on the layer's device."""
        self._face = face_of(layer)
        device = layer.weight.device
        self._weight_probe = torch.full((), float("nan"), dtype=dtype, device=device)

    @property
    def weight(self) -> torch.Tensor:
        """A read-only view with the replaced weight's shape, this module's device and the
        engine's dtype; its values are NaN, not the weight (module docstring)."""
        return self._weight_probe.expand(self._face.weight_shape)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> DropIn:
        """`.to()`, `.cuda()`, `.half()` move and cast the probe as they would a weight."""
        super()._apply(fn, recurse)
        self._weight_probe = fn(self._weight_probe)
        return self
