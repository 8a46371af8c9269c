"""Which activations can move into the epilogue of the FP8 layer that feeds them.

An activation module is absorbed into layer L when, in one traced forward pass, it is called
exactly once, is registered once, and its input is exactly L's output tensor (an `nn.Identity`
left by BatchNorm folding passes the same tensor through). That covers timm's `BatchNormAct2d`
after folding, `nn.Sequential(conv, bn, act)` and `Mlp` (fc1 -> act). A functional use of L's raw
output elsewhere would be invisible to hooks, so the absorption is then checked: the float model
with every absorption applied must give bit-identical output (same operations in the same order)
on the example and on a seeded wide random input; candidates that break it are dropped.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import tensor_links
from quantstudy.quant.layers.fused_matmul import activation_name
from quantstudy.record.vocab import Activation


def _candidates(model: nn.Module, layers: list[str], example: torch.Tensor) -> dict[str, str]:
    """layer -> name of the activation module that consumes exactly its output."""
    registered = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    acts = [
        name
        for name, mod in model.named_modules()
        if name not in layers and activation_name(mod) is not None and registered[id(mod)] == 1
    ]
    links, calls = tensor_links(model, example, layers, acts)
    found: dict[str, str] = {}
    for layer, act in links:
        found.setdefault(layer, act)
    return {layer: act for layer, act in found.items() if calls[act] == 1}


def with_absorbed(model: nn.Module, pairs: dict[str, str]) -> nn.Module:
    """A copy of `model` with each activation of `pairs` (layer -> activation) moved behind its
    layer: `nn.Sequential(layer, act)` in the layer's place, `nn.Identity` in the act's."""
    trial = copy.deepcopy(model)
    for layer, act in pairs.items():
        act_module = trial.get_submodule(act)
        replace_module(trial, act, nn.Identity())
        replace_module(trial, layer, nn.Sequential(trial.get_submodule(layer), act_module))
    return trial


def _probes(example: torch.Tensor) -> list[torch.Tensor]:
    """The example plus a seeded wide random input: a check on inputs that never drive a
    pre-activation negative could not tell ReLU(y) from y."""
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(example.shape, generator=g).to(example.device, example.dtype) * 3
    return [example, noise]


def exact_subset(
    model: nn.Module,
    example: torch.Tensor,
    pairs: dict[str, str],
    rewrite: Callable[[nn.Module, dict[str, str]], nn.Module],
) -> dict[str, str]:
    """The pairs whose rewrite of `model` (a copy built by `rewrite(model, pairs)`) leaves its
    output bit-identical on the example and a seeded wide random input: all of them if that
    holds together, else those that pass alone, if they also pass together; else none. A
    rewrite whose modules refuse their inputs (ValueError) is not exact."""
    if not pairs:
        return {}
    probes = _probes(example)
    with torch.no_grad():
        refs = [model.eval()(x) for x in probes]

    def exact(chosen: dict[str, str]) -> bool:
        trial = rewrite(model, chosen).eval()
        try:
            with torch.no_grad():
                return all(torch.equal(trial(x), ref) for x, ref in zip(probes, refs, strict=True))
        except ValueError:  # a rewritten module refused its input: that rewrite cannot be
            return False

    if exact(pairs):
        return pairs
    pairs = {k: v for k, v in pairs.items() if exact({k: v})}
    return pairs if pairs and exact(pairs) else {}  # each passes alone, not together: none


def absorbable_activations(
    model: nn.Module, layers: list[str], example: torch.Tensor
) -> dict[str, tuple[str, str]]:
    """layer -> (activation module name, epilogue activation), checked bit-exactly."""
    pairs = exact_subset(model, example, _candidates(model, layers, example), with_absorbed)
    return {
        layer: (act, activation_name(model.get_submodule(act)) or Activation.NONE)
        for layer, act in pairs.items()
    }


def remove_activations(model: nn.Module, absorbed: dict[str, tuple[str, str]]) -> None:
    """Replace each absorbed activation module of `model` by `nn.Identity` (in place)."""
    for act, _ in absorbed.values():
        replace_module(model, act, nn.Identity())
