"""Residual sums that are also the next FP8 layer's input, written in both forms by one epilogue.

Why: once `quant/rewrites/residual.py` has moved a block's add into the block's last FP8 layer, the
sum is read twice by what follows: the next FP8 layer quantizes it (an Inductor pass that reads the
fp16 sum and writes FP8) and the next shortcut reads it in fp16. The layer writing the sum can
also write the FP8 copy with the reader's scale (`fp8_gemm_pair`), and that quantize pass and
its fp16 read disappear. Off by default all the same: the second output slows the products
that write it (autotuned to narrower tiles) by more than the quantize passes it saves cost
(docs/fp8-kernel.md, "Residual sums in the epilogue", has the measurement;
`tools/lab/bench/epilogue.py` times it one product at a time).

The reader sits in the next block, so the smallest module holding both calls (a stage, or the
model itself) is traced with the residual rewrite's tracer and rewritten: the sum's layer
returns (sum, FP8 copy) and the reader takes the copy (its input read as is, as an FP8
hand-off's consumer does, `quant/rewrites/handoff.py`). A reader qualifies when it is a fused FP8
layer called once, reading exactly the sum, with a static per-tensor scale and no K padding; of
several, the first. As for every rewrite, a float copy with the same rewrite (the sum's layer
returning the sum twice) must leave the model's output bit-identical.
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.fx as fx
from torch import nn

from quantstudy.quant.rewrites.absorb import exact_subset
from quantstudy.quant.rewrites.residual import Site, ancestors, install, relative, trace_scope


@dataclass(frozen=True)
class SumHandoff:
    """The sum's layer writes `reader`'s FP8 input; `scope` is the module rewritten ("" the
    model)."""

    scope: str
    reader: str


def _scopes(block: str) -> list[str]:
    """The block and every module above it, the model last ("")."""
    return [block, *ancestors(block), ""]


def _find(
    graph: fx.Graph, layer: str, readers: set[str]
) -> tuple[fx.Node, fx.Node] | Literal["up"] | None:
    """(the sum's call, its reader's call) in `graph` (names relative to it); "up" when the sum
    leaves the graph unread by a reader (look in the module above); None when there is none."""
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == layer]
    if len(calls) != 1 or len(calls[0].args) != 2:
        return None
    node = calls[0]
    called = Counter(n.target for n in graph.nodes if n.op == "call_module")
    for user in node.users:  # graph order
        if (
            user.op == "call_module"
            and user.target in readers
            and called[user.target] == 1
            and user.args == (node,)
            and not user.kwargs
        ):
            return node, user
    return "up" if any(u.op == "output" for u in node.users) else None


def _candidates(
    model: nn.Module, sites: dict[str, Site], layers: list[str], readers: set[str]
) -> dict[str, SumHandoff]:
    """Sum layer -> its hand-off, looking upward from the sum's block until the sum is read
    (by a qualifying reader or not) or a module does not trace."""
    found: dict[str, SumHandoff] = {}
    taken: set[str] = set()  # a reader reads one copy
    graphs: dict[str, fx.Graph | None] = {}
    for layer, site in sites.items():
        for scope in _scopes(site.block):
            if scope not in graphs:
                graphs[scope] = trace_scope(model, scope, layers)
            graph = graphs[scope]
            if graph is None:
                break
            inside = [r for r in readers - taken if not scope or r.startswith(scope + ".")]
            own = {relative(r, scope) for r in inside}
            hit = _find(graph, relative(layer, scope), own)
            if hit == "up":
                continue
            if hit is not None:
                reader = f"{scope}.{hit[1].target}" if scope else hit[1].target
                taken.add(reader)
                found[layer] = SumHandoff(scope, reader)
            break
    return found


def rewrite_pairs(
    model: nn.Module,
    pairs: dict[str, SumHandoff],
    layers: list[str],
    wrap: Callable[[nn.Module, nn.Module], None],
) -> nn.Module:
    """`model` with each scope of `pairs` replaced by its traced graph, the sum's call
    returning (sum, FP8 copy) and the reader taking the copy; `wrap(sum layer, reader)` makes
    the two modules do so. Deepest scopes first; returns the model (a new module when the model
    itself is a scope)."""
    scopes = sorted({p.scope for p in pairs.values()}, key=lambda s: -len(s.split(".")) if s else 0)
    for scope in scopes:
        graph = trace_scope(model, scope, layers, strict=True)
        mine = {layer: p for layer, p in pairs.items() if p.scope == scope}
        for layer, pair in mine.items():
            hit = _find(graph, relative(layer, scope), {relative(pair.reader, scope)})
            if not isinstance(hit, tuple):
                raise RuntimeError(f"{layer}: its reader {pair.reader} is not found again")
            node, reader = hit
            with graph.inserting_after(node):
                fp16 = graph.call_function(operator.getitem, (node, 0))
            with graph.inserting_after(fp16):
                fp8 = graph.call_function(operator.getitem, (node, 1))
            copies = (fp16, fp8)
            node.replace_all_uses_with(fp16, delete_user_cb=lambda u, c=copies: u not in c)
            reader.args = (fp8,)
            wrap(model.get_submodule(layer), model.get_submodule(pair.reader))
        graph.lint()
        model = install(model, scope, graph)  # the model itself comes last
    return model


def sum_handoffs(
    summed: nn.Module,
    sites: dict[str, Site],
    layers: list[str],
    readers: set[str],
    example: torch.Tensor,
) -> dict[str, SumHandoff]:
    """Sum layer -> its hand-off, among `sites` of `summed` (the float model with the residual
    rewrite applied, `residual.float_summed`), readers among `readers` (the engine's fused
    layers that can read an FP8 input); found and checked as the module docstring says."""
    pairs = _candidates(summed, sites, layers, readers)

    def twice(layer: nn.Module, _reader: nn.Module) -> None:
        layer.pair = True  # a `FloatResidual`: the sum, twice

    def trial(model: nn.Module, chosen: dict[str, str]) -> nn.Module:
        return rewrite_pairs(copy.deepcopy(model), {k: pairs[k] for k in chosen}, layers, twice)

    kept = exact_subset(summed, example, {k: p.reader for k, p in pairs.items()}, trial)
    return {k: pairs[k] for k in kept}


def can_read_fp8(layer: nn.Module) -> bool:
    """Whether a fused FP8 layer can take its input already quantized: a static per-tensor
    scale, no migration divisor, no K padding, not already a hand-off's reader."""
    return not (layer.fp8_input or layer.row_scales or layer.k_pad) and layer.x_divisor is None


def fuse_sum_handoffs(
    model: nn.Module, pairs: dict[str, SumHandoff], layers: list[str]
) -> nn.Module:
    """The engine `model` rewritten so that each sum layer of `pairs` also writes its reader's
    FP8 input; returns it (a new module when the model itself was rewritten)."""

    def hand(layer: nn.Module, reader: nn.Module) -> None:
        layer.pair_scale = reader.x_scale.detach().clone()
        reader.fp8_input = True

    return rewrite_pairs(model, pairs, layers, hand)
