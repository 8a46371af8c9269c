"""The FP8 engine's module: the plan's layers as FP8 modules and the rewrites that move work
into their epilogues, assembled with or without hand-offs.

Why twice: a layer tied by a hand-off cannot step aside (`engines/step_aside.py`), and in a
ResNet every 3x3 conv reads its 1x1 producer's hand-off. So a "fastest" engine is timed in an
assembly without hand-offs (`handoffs=False`, the screen of docs/DESIGN.md's kernel-choice
loop), then assembled with the hand-offs among the layers that stay FP8 (`aside`: those kept
in fp16). `FP8Assembler` makes the analyses both share (absorbed activations, residual sums)
once.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Set
from dataclasses import dataclass, field

import torch
from torch import nn

from quantstudy.engines.base import in_memory_format
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant import backends
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.plan.apply import Applied, QuantPlan, apply_fp8, real_layers
from quantstudy.quant.rewrites.absorb import (
    absorbable_activations,
    remove_activations,
    with_absorbed,
)
from quantstudy.quant.rewrites.handoff import fp8_handoffs
from quantstudy.quant.rewrites.pad_handoff import fuse_padded, padded_outputs
from quantstudy.quant.rewrites.residual import (
    RewriteSkipped,
    Site,
    float_summed,
    fuse_residuals,
    residual_sites,
)
from quantstudy.quant.rewrites.sum_handoff import (
    SumHandoff,
    can_read_fp8,
    fuse_sum_handoffs,
    sum_handoffs,
)
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import Activation, Epilogue


@dataclass
class FP8Assembly:
    """One assembly: the module (on the device, channels-last) and what each rewrite did."""

    model: nn.Module
    applied: Applied
    epilogue: dict[str, str]  # layer -> the activation its epilogue computes
    handoff: dict[str, str]  # producer -> the reader whose FP8 input it writes
    sites: dict[str, Site]  # layer -> its residual sum
    sum_handoff: dict[str, SumHandoff]
    padded: dict[str, str]  # producer -> the conv whose padded input it writes
    skipped: dict[str, str] = field(default_factory=dict)  # rewrite -> why not applied


@dataclass
class FP8Assembler:
    """What every assembly of one plan shares: the deployed float `source`, its real layers,
    the activations absorbed into them and (after the first assembly) the residual sums."""

    source: nn.Module
    plan: QuantPlan
    dtype: torch.dtype
    device: torch.device
    example: torch.Tensor
    spec: BuildSpec  # the backend built, how it sums, which rewrites it makes

    def __post_init__(self) -> None:
        self.kernel = self.spec.backend
        self.backend = backends.get(self.kernel)
        takes = self.backend.support.takes
        self.real = real_layers(self.source, self.plan.layers, self.kernel)
        self.absorbed: dict[str, tuple[str, str]] = {}
        if Epilogue.ACTIVATION in self.backend.support.epilogues:
            found = absorbable_activations(self.source, self.real, self.example)
            self.absorbed = {
                n: a for n, a in found.items() if takes(Epilogue.ACTIVATION, Activation(a[1]))
            }
        self._sites: tuple[dict[str, Site], dict[str, str]] | None = None

    def assemble(
        self,
        *,
        handoffs: bool = True,
        aside: Set[str] = frozenset(),
        unlinked: Set[str] = frozenset(),
    ) -> FP8Assembly:
        """The FP8 module with every rewrite the options allow; with `handoffs` False no layer
        hands anything off, else none of the `aside` layers does (module docstring), and no
        producer of `unlinked` hands its output to the next layer in FP8 (both run
        torch._scaled_mm, `kernel_choice.scaled_mm_pairs`)."""
        source, plan, example = self.source, self.plan, self.example
        takes = self.backend.support.takes
        linked = handoffs and takes(Epilogue.FP8_OUTPUT)
        tied = [n for n in self.real if n not in aside]
        handoff = fp8_handoffs(source, tied, example, self.absorbed) if linked else {}
        handoff = {
            p: c
            for p, c in handoff.items()
            if p not in unlinked and plan.static_input(c, source.get_submodule(c))
        }
        m = copy.deepcopy(source)
        remove_activations(m, self.absorbed)
        m = drop_eval_caches(m.to(self.dtype))
        epilogue = {layer: act for layer, (_, act) in self.absorbed.items()}
        applied = apply_fp8(
            m, source, plan, self.dtype, self.kernel, epilogue, handoff, build=self.spec
        )
        fused = [n for n in applied.real if isinstance(m.get_submodule(n), FusedFP8Matmul)]
        sums = takes(Epilogue.RESIDUAL)
        sites, skipped = self._residual_sites(fused) if sums else ({}, {})
        fuse_residuals(m, sites, fused)
        pairs: dict[str, SumHandoff] = {}
        if sites and linked and self.spec.sum_handoff and takes(Epilogue.FP8_PAIR):
            readers = {
                n
                for n in fused
                if n not in aside
                and can_read_fp8(m.get_submodule(n))
                and plan.static_input(n, source.get_submodule(n))
            }
            summed = float_summed(self.absorbed_base, sites, fused)
            writers = {n: s for n, s in sites.items() if n not in aside}
            pairs = sum_handoffs(summed, writers, fused, readers, example)
            m = fuse_sum_handoffs(m, pairs, fused)
        padded: dict[str, str] = {}
        if linked and self.spec.pad_outputs and takes(Epilogue.PADDED_OUTPUT):
            pad_writers = [n for n in applied.real if n not in aside]
            padded = padded_outputs(m, source, pad_writers, example, self.absorbed)
            fuse_padded(m, source, padded)
        m = in_memory_format(m.to(self.device), torch.channels_last)
        self.backend.bind(m, self.device)
        return FP8Assembly(m, applied, epilogue, handoff, sites, pairs, padded, dict(skipped))

    @functools.cached_property
    def absorbed_base(self) -> nn.Module:
        """The float `source` with the absorbed activations moved into their layers: what the
        residual rewrite and the sum hand-off are found and checked on, made once."""
        return with_absorbed(self.source, {k: act for k, (act, _) in self.absorbed.items()})

    def _residual_sites(self, fused: list[str]) -> tuple[dict[str, Site], dict[str, str]]:
        """The residual sums of the fused 1x1/linear layers, found once (every assembly has the
        same fused layers: the hand-offs change how they are fed, not which they are)."""
        if not self.spec.residual:
            return {}, {}
        if self._sites is None:
            try:
                self._sites = residual_sites(self.absorbed_base, fused, self.example), {}
            except RewriteSkipped as err:  # the engine without it; the record says why
                self._sites = {}, {"residual": str(err)}
        return self._sites
