"""Residual sums moved into the epilogue of the FP8 layer that feeds them.

Why: a residual block ends `act(layer(x) + shortcut)` (res2net's Bottle2neck: conv3, the
in-place `out += shortcut`, ReLU; an inverted residual: the projection conv plus the block
input; a transformer block: fc2 plus the stream). In the fused engine the layer writes its fp16
output and a separate pass reads it back with the shortcut; with the sum in the layer's
epilogue (`quant/kernels/gemm.py`, `_finish`) that write and read disappear (docs/fp8-kernel.md).

The add is a functional op, invisible to module hooks, so the block that holds it is traced with
`torch.fx` (the FP8 layers, convs, linears and activations kept as leaves). A site is a fused
1x1/linear layer whose output, after operations that pass it on unchanged (an eval-mode dropout;
`nn.Identity` and a zero drop path leave no node), has exactly one reader, an add of one other
tensor that the engine stores anyway (`_stored_anyway`), optionally followed by an activation
the epilogue computes and that is the sum's only reader. The smallest traceable module above the
layer (not the model itself) that holds such an add is rewritten: the layer is called with the
other tensor as its residual and the add and activation leave the graph. Candidates are then
checked as activation absorption is (`quant/rewrites/absorb.py`): in a float copy the same rewrite
(the layer wrapped in `FloatResidual`, the same operations in the same order) must leave the model's
output bit-identical on the example and a seeded wide random input.
"""

from __future__ import annotations

import contextlib
import copy
import io
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.fused_matmul import activation_name
from quantstudy.quant.rewrites.absorb import exact_subset
from quantstudy.record.vocab import Activation


class RewriteSkipped(Exception):
    """A rewrite that cannot be applied to this model at all (its traced blocks do not run):
    the engine is built without it, and the record says why (`EngineInfo.fp8_rewrites_skipped`)."""


_ADDS = {operator.add, operator.iadd, torch.add}
_IN_PLACE = {operator.iadd, "add_"}
_RELU_FUNCTIONS = {F.relu, torch.relu}


class _Tracer(fx.Tracer):
    """Leaves: the layers named, every conv, linear and activation module, what torch.nn
    keeps as leaves, and this package's modules (quantized layers); `nn.Identity` is traced
    through so that it leaves no node."""

    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.leaves:
            return True
        if type(m) is nn.Identity:
            return False
        return (
            isinstance(m, (nn.Conv2d, nn.Linear))
            or activation_name(m) is not None
            or type(m).__module__.startswith("quantstudy.")
            or super().is_leaf_module(m, qualname)
        )


@dataclass(frozen=True)
class Match:
    """One site in a traced block: the layer's node, the add, the activation after it (None:
    none), the other term of the sum, and the epilogue's name for that activation."""

    layer: fx.Node
    add: fx.Node
    act_node: fx.Node | None
    other: fx.Node
    act: str


def relative(name: str, scope: str) -> str:
    """`name` as the module `scope` ("": the model) names it."""
    return name.removeprefix(scope + ".") if scope else name


@overload
def trace_scope(
    model: nn.Module, scope: str, layers: list[str], strict: Literal[True]
) -> fx.Graph: ...
@overload
def trace_scope(
    model: nn.Module, scope: str, layers: list[str], strict: bool = False
) -> fx.Graph | None: ...
def trace_scope(
    model: nn.Module, scope: str, layers: list[str], strict: bool = False
) -> fx.Graph | None:
    """The graph of `model`'s module `scope` ("": the model), the `layers` under it kept as
    leaves; None where it does not trace (untraceable code only means no site there), unless
    `strict`."""
    leaves = {relative(n, scope) for n in layers if not scope or n.startswith(scope + ".")}
    try:
        return _Tracer(leaves).trace(model.get_submodule(scope))
    except Exception:
        if strict:
            raise
        return None


def install(model: nn.Module, scope: str, graph: fx.Graph) -> nn.Module:
    """`model` with its module `scope` replaced (in place) by `graph` as a GraphModule of the
    same submodules; the GraphModule itself where the scope is the model ("")."""
    module = model.get_submodule(scope)
    traced = fx.GraphModule(module, graph, class_name=type(module).__name__)
    if not scope:
        return traced
    replace_module(model, scope, traced)
    return model


def _passes_on(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether `node` returns its first input unchanged (dropout in eval mode)."""
    if node.op == "call_module":
        m = modules.get(node.target)
        return isinstance(m, nn.Dropout) and (not m.training or m.p == 0)
    if node.op == "call_function" and node.target is F.dropout:
        training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        return training is False
    return False


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _activation(
    node: fx.Node, modules: dict[str, nn.Module]
) -> tuple[str, Callable[..., Any]] | None:
    """(epilogue name, the callable) of an activation node on one tensor, else None."""
    if node.op == "call_module":
        m = modules.get(node.target)
        name = activation_name(m) if m is not None else None
        return (name, m) if m is not None and name is not None and len(node.args) == 1 else None
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS and len(node.args) == 1:
        inplace = node.kwargs.get("inplace", False)
        return (Activation.RELU, F.relu) if not inplace else None
    return None


def _other_term(add: fx.Node, value: fx.Node) -> fx.Node | None:
    """The other tensor `add` sums with `value`; None if it is not a plain two-tensor add, or
    is in place on the other tensor (that tensor's other readers would see the sum)."""
    is_add = add.op == "call_function" and add.target in _ADDS
    is_add |= add.op == "call_method" and add.target in ("add", "add_")
    if not is_add or len(add.args) != 2 or add.kwargs:
        return None
    a, b = add.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or a is b:
        return None
    if add.target in _IN_PLACE and a is not value:
        return None
    return b if a is value else a


def _stored_anyway(node: fx.Node) -> bool:
    """Whether the compiled engine writes the other term to memory whatever the layer does: a
    block input, a module's output (a cuDNN or FP8 kernel's), or a value with other readers.
    A value only the add reads (ghostnet's concatenated halves) Inductor computes inside the
    add's kernel; handing it to the layer would write it once more (docs/fp8-kernel.md
    measures that cost)."""
    return node.op in ("placeholder", "call_module") or len(node.users) > 1


def find_match(graph: fx.Graph, modules: dict[str, nn.Module], layer: str) -> Match | None:
    """The site of `layer` (a name relative to the traced block) in `graph`, if any."""
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == layer]
    if len(calls) != 1 or len(calls[0].args) != 1 or calls[0].kwargs:
        return None  # a layer called twice would take a residual at one call only
    node = calls[0]
    value = node
    while (user := _only_user(value)) is not None and _passes_on(user, modules):
        value = user
    add = _only_user(value)
    other = _other_term(add, value) if add is not None else None
    if other is None or not _stored_anyway(other):
        return None
    after = _only_user(add)
    act = _activation(after, modules) if after is not None else None
    return Match(node, add, after if act else None, other, act[0] if act else Activation.NONE)


def _fuse(graph: fx.Graph, match: Match) -> None:
    """Call the layer with its residual where the sum (or its activation) was, and drop the
    nodes the call replaces."""
    last = match.act_node or match.add
    with graph.inserting_before(last):
        call = graph.call_module(match.layer.target, (match.layer.args[0], match.other))
    last.replace_all_uses_with(call)
    chain, node = [], match.layer
    while node is not match.add:  # the layer and the pass-on nodes after it
        chain.append(node)
        node = next(iter(node.users))
    dead = [last] + ([match.add] if match.act_node is not None else []) + chain[::-1]
    for n in dead:  # readers before what they read
        graph.erase_node(n)


@dataclass(frozen=True)
class Site:
    """An FP8 layer whose residual sum moves into its epilogue: the block rewritten, and the
    activation after the sum ("none": none)."""

    block: str
    act: str


def ancestors(name: str) -> list[str]:
    """The modules above `name`, nearest first, the model itself left out."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _candidates(model: nn.Module, layers: list[str]) -> dict[str, Site]:
    """layer -> its site, in the smallest traceable module above it that holds its add; where
    two layers feed one add, the first of `layers`."""
    graphs: dict[str, fx.Graph | None] = {}
    modules: dict[str, dict[str, nn.Module]] = {}
    found: dict[str, Site] = {}
    taken: set[fx.Node] = set()  # one layer per add: conv3 and a downsample conv share one
    for layer in layers:
        for block in ancestors(layer):
            if block not in graphs:
                graphs[block] = trace_scope(model, block, layers)
            graph = graphs[block]
            if graph is None:
                continue
            if block not in modules:
                modules[block] = dict(model.get_submodule(block).named_modules())
            match = find_match(graph, modules[block], relative(layer, block))
            if match is not None:
                if match.add not in taken:
                    taken.add(match.add)
                    found[layer] = Site(block, match.act)
                break
    return found


def rewrite(
    model: nn.Module,
    sites: dict[str, Site],
    layers: list[str],
    wrap: Callable[[nn.Module, Match, dict[str, nn.Module]], nn.Module],
) -> nn.Module:
    """`model` (in place) with each site's block replaced by its traced graph, rewritten so that
    the layer takes the sum's other term as its residual; each layer becomes
    `wrap(layer, match, block's modules)`. `layers` are the leaves of the traces, as found."""
    blocks: dict[str, list[str]] = {}
    for layer, site in sites.items():
        blocks.setdefault(site.block, []).append(layer)
    for block, members in blocks.items():
        graph = trace_scope(model, block, layers, strict=True)
        modules = dict(model.get_submodule(block).named_modules())
        wrapped = {}
        for layer in members:
            match = find_match(graph, modules, relative(layer, block))
            if match is None:
                raise RuntimeError(f"{layer}: its residual sum is not found again in {block}")
            wrapped[layer] = wrap(modules[relative(layer, block)], match, modules)
            _fuse(graph, match)
        graph.lint()
        install(model, block, graph)  # a block, never the model: `ancestors`
        for layer, new in wrapped.items():
            replace_module(model, layer, new)
    return model


class FloatResidual(nn.Module):
    """act(layer(x) + residual) in float, with the block's own activation: the check's copy of
    what the fused layer computes, refusing (ValueError) what the fused layer cannot take: a
    residual of another shape (a broadcast add) or dtype."""

    def __init__(self, layer: nn.Module, act: Callable[..., Any] | None) -> None:
        super().__init__()
        self.layer = layer
        self.act = act  # the block's module (registered as a child) or a function
        # return the sum twice, as a sum hand-off does (`quant/rewrites/sum_handoff.py`)
        self.pair = False

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = self.layer(x)
        if residual.shape != y.shape or residual.dtype != y.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} for an output {tuple(y.shape)}")
        y = y + residual
        y = self.act(y) if self.act is not None else y
        return (y, y) if self.pair else y


def _float_wrap(layer: nn.Module, match: Match, modules: dict[str, nn.Module]) -> nn.Module:
    act = None
    if match.act_node is not None:
        found = _activation(match.act_node, modules)
        assert found is not None  # the match was made of an activation `_activation` knows
        act = found[1]
    return FloatResidual(layer, act)


def float_summed(base: nn.Module, sites: dict[str, Site], layers: list[str]) -> nn.Module:
    """A copy of the float `base` with the sites' sums in their layers (`FloatResidual`)."""
    return rewrite(copy.deepcopy(base), sites, layers, _float_wrap)


def residual_sites(base: nn.Module, layers: list[str], example: torch.Tensor) -> dict[str, Site]:
    """layer -> site among `layers` (fused 1x1/linear FP8 layers, named in `base`, the float
    model as the engine computes it: BatchNorm folded, activations absorbed), found and checked
    as the module docstring says."""
    sites = _candidates(base, layers)

    def trial(model: nn.Module, chosen: dict[str, str]) -> nn.Module:
        return float_summed(model, {k: sites[k] for k in chosen}, layers)

    try:
        # a traced module that raises prints its own traceback to stderr before raising
        # (torch.fx `_WrappedCall`): a failing trial is handled here, so that print is noise
        with contextlib.redirect_stderr(io.StringIO()):
            kept = exact_subset(base, example, {k: s.block for k, s in sites.items()}, trial)
    except Exception as err:
        # torch.fx records one path through a block's Python: a traced graph can fail on real
        # tensors in any way its code can (timm's DlaTree: a TypeError from a default argument
        # the trace turned into a proxy). Nothing is rewritten then, and the record says so.
        raise RewriteSkipped(
            f"residual sums in the epilogue skipped: a traced block of this model does not run "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from err
    return {k: sites[k] for k in kept}


def fuse_residuals(model: nn.Module, sites: dict[str, Site], layers: list[str]) -> None:
    """Rewrite the engine `model` (in place) so that each site's fused FP8 layer sums its
    residual and applies the activation after it in its epilogue."""

    def take(layer: nn.Module, match: Match, _modules: dict[str, nn.Module]) -> nn.Module:
        layer.res_act = match.act
        return layer

    rewrite(model, sites, layers, take)
