"""One traced forward pass: which module consumes exactly the tensor another one produced.

BatchNorm folding (a BN reading a conv's output), activation absorption (an activation reading
an FP8 layer's output) and FP8 hand-offs (an FP8 layer reading another's) link modules by the
identity of the tensor between them. Outputs are kept alive during the pass so that identity,
not a reused address, makes the link; and the tensor's version counter must not have moved, so
that an in-place change in between (ResNet's `out += shortcut` before its ReLU) breaks the link.
A value check cannot see that change where it happens to be a no-op (timm zero-initialises the
last BatchNorm of residual blocks, so with random weights the branch adds exact zeros).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

PreHook = Callable[[nn.Module, tuple[Any, ...]], object]


@contextmanager
def pre_hooks(model: nn.Module, hooks: Iterable[tuple[str, PreHook]]) -> Iterator[None]:
    """Forward pre-hooks on `model`'s submodules (name, hook), removed on leaving, whatever
    the pass raised: every capture pass of calibration, the fit and the benchmarks."""
    handles = [model.get_submodule(name).register_forward_pre_hook(h) for name, h in hooks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def forward_once(model: nn.Module, example: torch.Tensor, handles: list[RemovableHandle]) -> None:
    """Run `model` in eval mode without grad on `example`, then remove `handles` (always)."""
    try:
        with torch.no_grad():
            model.eval()(example)
    finally:
        for h in handles:
            h.remove()


def input_shapes(
    model: nn.Module, example: torch.Tensor, layers: Iterable[str]
) -> dict[str, tuple[int, ...]]:
    """Shape of each layer's first positional input in one forward pass on `example` (layers
    that did not run are absent)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str) -> PreHook:
        def hook(_m: nn.Module, args: tuple[object, ...]) -> None:
            if name not in shapes and args and isinstance(args[0], torch.Tensor):
                shapes[name] = tuple(int(s) for s in args[0].shape)

        return hook

    with pre_hooks(model, [(n, record(n)) for n in layers]), torch.no_grad():
        model.eval()(example)
    return shapes


def tensor_links(
    model: nn.Module, example: torch.Tensor, producers: Iterable[str], consumers: Iterable[str]
) -> tuple[list[tuple[str, str]], Counter[str]]:
    """(producer, consumer) pairs, in call order and each once, where the consumer's first input
    is exactly a tensor the producer returned, unchanged since; and how often each consumer was
    called."""
    produced: dict[int, tuple[torch.Tensor, str, int]] = {}
    links: list[tuple[str, str]] = []
    calls: Counter[str] = Counter()

    def out_hook(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(_m: nn.Module, _inp: object, out: object) -> None:
            if isinstance(out, torch.Tensor):
                produced[id(out)] = (out, name, out._version)

        return hook

    def in_hook(name: str) -> PreHook:
        def hook(_m: nn.Module, inp: tuple[object, ...]) -> None:
            calls[name] += 1
            hit = produced.get(id(inp[0])) if inp else None
            if hit is None or hit[0] is not inp[0] or hit[2] != inp[0]._version:
                return
            if (hit[1], name) not in links:
                links.append((hit[1], name))

        return hook

    handles = [model.get_submodule(n).register_forward_hook(out_hook(n)) for n in producers]
    handles += [model.get_submodule(n).register_forward_pre_hook(in_hook(n)) for n in consumers]
    forward_once(model, example, handles)
    return links, calls
