"""The modules that may replace a fused FP8 layer under the per-layer kernel choice
(`engines/kernel_choice.py`), built once each, so the module timed is the module installed.

Per layer and kernel:
- A backend whose layer takes the fused layer's whole state (`Backend.takes_fused`, cuBLASLt's
  `LtFP8Matmul`) is made from the fused layer itself (`Backend.from_fused`): the same absorbed
  activation, residual sum, FP8 hand-offs and input, computed in its own epilogue. It is a
  candidate only where it runs its own kernel for that state (cuBLASLt has no form for an
  activation after the residual sum, nor its tanh GELU under the recipe's `gelu: erf`): timed
  there, it would time the fused kernel under its name.
- Any other backend's layer comes from an engine of the same plan built with that backend,
  made on first use, and is followed by the fused layer's epilogue as separate ops (`Unfused`:
  the layer is built from the float layer, without the engine's rewrites).
- "fp16": the float layer of `plain`, with the fused layer's epilogue as separate ops.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from quantstudy.engines.layer_timing import fp16_side
from quantstudy.engines.unfused import Unfused
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant import backends
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.plan.apply import QuantPlan, apply_fp8
from quantstudy.record.build_spec import DEFAULT_BACKEND, BuildSpec
from quantstudy.record.engines import FP16
from quantstudy.record.errors import UserError


@dataclass
class Candidates:
    """The modules that may replace a fused layer of `model` (module docstring)."""

    model: nn.Module
    source: nn.Module
    plain: nn.Module
    plan: QuantPlan
    dtype: torch.dtype
    device: torch.device
    spec: BuildSpec  # the engine's: every candidate sums as it says

    def __post_init__(self) -> None:
        self._alt: dict[str, nn.Module] = {}
        self._layers: dict[tuple[str, str], nn.Module | None] = {}
        self._built: dict[tuple[str, str], nn.Module] = {}

    def others(self, name: str, layer: nn.Module) -> list[str]:
        """The backends besides the base one that may time the fused 1x1/linear `layer` (named
        `name`) here (the kxk and depthwise convs have the fused kernel only): those this
        machine runs whose blocker takes its float layer and whose layer runs its own kernel
        for it (`_layer`). A backend that refuses the layer (cuBLASLt's alignment) or falls
        back to the fused kernel there would time a fused layer under its own name."""
        if not isinstance(layer, FusedFP8Matmul):
            return []
        float_layer = self.plain.get_submodule(name)
        return [
            n
            for n in backends.usable()
            if n != DEFAULT_BACKEND
            and backends.get(n).blocker(float_layer) is None
            and self._layer(name, n, layer) is not None
        ]

    def _engine(self, kernel: str) -> nn.Module:
        if kernel not in self._alt:
            alt = drop_eval_caches(copy.deepcopy(self.source).to(self.dtype))
            build = self.spec.but(kernel=kernel, choice=None)
            apply_fp8(alt, self.source, self.plan, self.dtype, kernel, build=build)
            self._alt[kernel] = alt.to(self.device)
            backends.get(kernel).bind(self._alt[kernel], self.device)
        return self._alt[kernel]

    def _layer(self, name: str, kernel: str, fused: nn.Module) -> nn.Module | None:
        """`kernel`'s layer for the fused layer `fused` named `name`: made from `fused` where
        the backend takes its state (None where it would not run its own kernel for it), else
        the layer of the engine built with that backend."""
        key = (name, kernel)
        if key not in self._layers:
            backend = backends.get(kernel)
            if backend.takes_fused:
                layer = backend.from_fused(fused, self.plan.gelu)
                if layer is not None:
                    backend.bind(layer, self.device)
            else:
                layer = self._engine(kernel).get_submodule(name)
            self._layers[key] = layer
        return self._layers[key]

    def get(self, name: str, kernel: str, fused: nn.Module) -> nn.Module:
        """The module that runs `kernel` in place of the fused layer `fused` named `name`: a
        layer made from `fused` as it is, any other followed by `fused`'s epilogue."""
        key = (name, kernel)
        if key not in self._built:
            if kernel == FP16:
                layer = self.plain.get_submodule(name)
                self._built[key] = fp16_side(layer, fused, self.dtype, self.device)
                return self._built[key]
            made = self._layer(name, kernel, fused)
            if made is None:
                raise UserError(
                    f"the FP8 kernel choice runs {name} on {kernel}, which in the engine this "
                    f"quantstudy builds has no kernel of its own for it; run the study again"
                )
            whole = backends.get(kernel).takes_fused
            self._built[key] = made if whole else Unfused.like(made, fused)
        return self._built[key]
