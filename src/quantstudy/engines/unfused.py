"""A layer followed by what a fused FP8 layer computes in its epilogue, as separate ops.

The fused FP8 layer (`quant/layers/fused_matmul.py`, `fused_conv.py`, `fused_depthwise.py`)
applies the activation that consumes it and, for a residual layer (`quant/rewrites/residual.py`),
the block's sum and the activation after it, before its one write. Any other layer put in its
place in the engine (the unfused torch._scaled_mm layer, `engines/kernel_choice.py`; the float
layer a "fastest" engine steps aside to, `engines/step_aside.py`) must compute the same, and the
engine graph no longer holds those ops (the rewrites removed them), so `Unfused` runs them after
the layer, where the compiled engine fuses them as it would in the fp16 engine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from quantstudy.record.vocab import Activation

# The epilogue's activations (`quant.layers.fused_matmul.ACTIVATIONS`) as modules.
ACT_MODULES: dict[str, Callable[[], nn.Module]] = {
    Activation.RELU: nn.ReLU,
    Activation.RELU6: nn.ReLU6,
    Activation.SILU: nn.SiLU,
    Activation.HARDSWISH: nn.Hardswish,
    Activation.GELU: nn.GELU,
}


def act_module(act: str) -> nn.Module:
    return ACT_MODULES[act]() if act != Activation.NONE else nn.Identity()


class Unfused(nn.Module):
    """`layer`, then the fused layer's epilogue as separate ops: the absorbed activation, then,
    for a residual layer, the sum and the activation after it."""

    def __init__(self, layer: nn.Module, act: str, res_act: str | None) -> None:
        super().__init__()
        self.layer, self.act = layer, act_module(act)
        self.res_act = act_module(res_act) if res_act is not None else None

    @classmethod
    def like(cls, layer: nn.Module, fused: nn.Module) -> Unfused:
        """`layer` with the epilogue of the FP8 layer `fused` (none for an unfused one) that
        `layer` does not compute itself: a backend whose kernel took the activation or the
        residual sum (`Support`) holds it as the fused layer does (`act`, `res_act`)."""
        act = getattr(fused, "act", Activation.NONE)
        res_act = getattr(fused, "res_act", None)
        unfused = cls(
            layer,
            act if getattr(layer, "act", Activation.NONE) == Activation.NONE else Activation.NONE,
            res_act if getattr(layer, "res_act", None) is None else None,
        )
        unfused.layer_sums = getattr(layer, "res_act", None) is not None
        if unfused.layer_sums and not isinstance(unfused.act, nn.Identity):
            raise ValueError("a layer that adds the residual must compute the activation before")
        return unfused

    layer_sums = False  # the layer adds the residual itself (and its activation after)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.layer_sums:
            return self.act(self.layer(x, residual))
        if (residual is None) != (self.res_act is None):
            raise ValueError("a residual layer takes its residual, and no other layer takes one")
        y = self.act(self.layer(x))
        return y if self.res_act is None else self.res_act(y + residual)
