"""Run an engine over a set of images, in fixed-size batches, with a progress bar."""

from __future__ import annotations

import torch
from rich.progress import Progress
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.quant.modules import QDQ


def run_engine(engine: Engine, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """float32 logits of `engine` for every image, in order.

    Every call sees the same batch shape (the last batch is padded with its first image and the
    padding dropped), so a compiled engine is never recompiled for a ragged tail.
    """
    outs = []
    n = images.shape[0]
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{engine.name}: {n} images", total=n)
        for start in range(0, n, batch_size):
            batch = images[start : start + batch_size]
            real = batch.shape[0]
            if real < batch_size and n > batch_size:
                pad = batch[:1].expand(batch_size - real, *batch.shape[1:])
                batch = torch.cat([batch, pad])
            outs.append(engine(batch)[:real])
            progress.advance(task, real)
    return torch.cat(outs)


def run_reordered(engine: Engine, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """`engine` (an eager emulation) again, channels-last: the same arithmetic with its fp32
    sums in another order, what the study's reassociation floor compares against."""
    engine.channels_last = True
    engine.module = engine.module.to(memory_format=torch.channels_last)
    try:
        return run_engine(engine, images, batch_size)
    finally:  # a later run of the emulation must sum in its own order again
        engine.channels_last = False
        engine.module = engine.module.to(memory_format=torch.contiguous_format)


def run_half_storage(
    engine: Engine, images: torch.Tensor, dtype: torch.dtype, batch_size: int = 64
) -> torch.Tensor:
    """`engine` (an eager float32 emulation) with every module's output, and the weights and
    biases of its float layers, rounded to `dtype`; the arithmetic stays float32.

    One correct implementation of the recipe that stores values in `dtype` between layers, as
    the half-precision engines do: FP8 rounding amplifies each such rounding as it amplifies a
    reordered fp32 sum, so its distance from the emulation is the floor for an engine that
    stores in `dtype`. The FP8 layers (`QDQ`) keep their weights (FP8 values whose float32
    scales the fused epilogue applies) and round only their output. Parameters are rounded in
    place and restored afterwards."""
    module = engine.module
    if not isinstance(module, nn.Module):
        raise TypeError(f"{engine.name}: half-precision storage needs an eager nn.Module")
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = []
    for sub in _storing_modules(module):
        if not isinstance(sub, QDQ):
            for p in sub.parameters(recurse=False):
                saved.append((p, p.detach().clone()))
                p.data = p.data.to(dtype).to(p.dtype)
        hooks.append(sub.register_forward_hook(lambda _m, _i, out: _rounded(out, dtype)))
    try:
        return run_engine(engine, images, batch_size)
    finally:
        for h in hooks:
            h.remove()
        for p, value in saved:
            p.data = value


def _storing_modules(module: nn.Module) -> list[nn.Module]:
    """The modules whose outputs an engine stores: leaves, and FP8 emulations as one unit."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        children = list(m.children())
        if isinstance(m, QDQ) or not children:
            found.append(m)
            return
        for c in children:
            visit(c)

    visit(module)
    return found


def _rounded(out: object, dtype: torch.dtype) -> object:
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.to(dtype).to(out.dtype)
    return out
