"""Which FP8 layers can hand their output to the next FP8 layer already quantized.

Layer P hands off to layer C when C's input is exactly P's output (after the activation P
absorbed; `nn.Identity` and eval-mode `nn.Dropout` pass the same tensor on) and nothing else
reads it, as in a vision transformer's MLP (fc1 -> GELU -> fc2). P's epilogue then writes C's
FP8 input with C's scale and C skips its quantize pass: P's fp16 output and the separate pass
that read it to write FP8 both disappear.

Hooks cannot see a functional use of P's output (a residual `x + fc1(x)`, say), so candidates
are checked: in a float copy P's output is doubled and C's input halved, both exact in float32,
and the model's output must stay bit-identical on the example and a seeded wide random input.
Only C reads the doubled tensor when that holds.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch import nn

from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import tensor_links
from quantstudy.quant.rewrites.absorb import exact_subset, with_absorbed


class _Times(nn.Module):
    """Multiply by a power of two: exact in floating point, so it marks a tensor's readers."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def _in_features(layer: nn.Module) -> int:
    return int(layer.in_channels if isinstance(layer, nn.Conv2d) else layer.in_features)


def _candidates(
    model: nn.Module, absorbed: nn.Module, layers: list[str], example: torch.Tensor
) -> dict[str, str]:
    """producer -> consumer in the `absorbed` copy of `model`: the consumer's input is exactly
    the producer's output, each is called once, the producer feeds no other FP8 layer, and the
    consumer's K needs no padding."""
    links, calls = tensor_links(absorbed, example, layers, layers)
    feeds = Counter(p for p, _ in links)
    return {
        p: c
        for p, c in links
        if feeds[p] == 1
        and calls[p] == 1
        and calls[c] == 1
        and _in_features(model.get_submodule(c)) % 16 == 0
    }


def marked_readers(model: nn.Module, pairs: dict[str, str]) -> nn.Module:
    """A copy of `model` with each producer's output doubled and its consumer's input halved:
    bit-identical output only where the consumer alone reads the producer's output."""
    trial = copy.deepcopy(model)
    for p, c in pairs.items():
        replace_module(trial, p, nn.Sequential(trial.get_submodule(p), _Times(2.0)))
        replace_module(trial, c, nn.Sequential(_Times(0.5), trial.get_submodule(c)))
    return trial


def fp8_handoffs(
    model: nn.Module,
    layers: list[str],
    example: torch.Tensor,
    absorbed: dict[str, tuple[str, str]],
) -> dict[str, str]:
    """producer -> consumer among `layers` (real FP8 layers of a fused engine, `absorbed` the
    activations moved into their epilogues), checked as the module docstring says."""
    base = with_absorbed(model, {layer: act for layer, (act, _) in absorbed.items()})
    return exact_subset(base, example, _candidates(model, base, layers, example), marked_readers)
