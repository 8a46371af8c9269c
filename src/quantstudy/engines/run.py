"""Run an engine over a set of images, in fixed-size batches, with a progress bar.

`run_engine` takes the whole set as one tensor; the streamed held-out pass
(`study/heldout.py`) calls `padded` and `device_logits` per batch and enters `reordered` and
`half_storage` around a chunk, so both paths feed an engine the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from rich.progress import Progress
from torch import nn

from quantstudy.engines.base import Engine, in_memory_format
from quantstudy.quant.layers.matmul import QDQ


def run_engine(
    engine: Engine, images: torch.Tensor, batch_size: int = 64, *, pad: bool = False
) -> torch.Tensor:
    """float32 logits of `engine` for every image, in order.

    Every call sees the same batch shape (the last batch is padded with its first image and the
    padding dropped), so a compiled engine is never recompiled for a ragged tail. `pad`: pad
    even a single short batch to `batch_size` (a set smaller than the batch that should reuse
    the compiled shape of another pass).
    """
    outs = []
    n = images.shape[0]
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{engine.name}: {n} images", total=n)
        for start in range(0, n, batch_size):
            batch = images[start : start + batch_size]
            real = batch.shape[0]
            total = max(n, batch_size + 1) if pad else n
            outs.append(engine(padded(batch, batch_size, total))[:real])
            progress.advance(task, real)
    return torch.cat(outs)


def padded(batch: torch.Tensor, batch_size: int, total: int) -> torch.Tensor:
    """`batch` filled up to `batch_size` with copies of its first image, when the whole pass
    (`total` images) is longer than one batch: a compiled engine then sees one batch shape and
    never recompiles for the ragged tail. The caller drops the padding's outputs."""
    real = batch.shape[0]
    if real < batch_size and total > batch_size:
        pad = batch[:1].expand(batch_size - real, *batch.shape[1:])
        batch = torch.cat([batch, pad])
    return batch


def device_logits(engine: Engine, x: torch.Tensor) -> torch.Tensor:
    """`engine(x)` as float32 logits left on the engine's device: no host synchronisation per
    batch (the streamed pass copies a chunk's logits to the host at once)."""
    with torch.no_grad():
        return engine.module(engine.prepare(x)).float()


def run_reordered(engine: Engine, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """`engine` (an eager emulation) again, channels-last: the same arithmetic with its fp32
    sums in another order, what the study's reassociation floor compares against."""
    with reordered(engine):
        return run_engine(engine, images, batch_size)


@contextmanager
def reordered(engine: Engine) -> Iterator[Engine]:
    """`engine` (an eager emulation) channels-last inside the block (`run_reordered`)."""
    module = cast(nn.Module, engine.module)  # an eager emulation runs its nn.Module
    engine.channels_last = True
    engine.module = in_memory_format(module, torch.channels_last)
    try:
        yield engine
    finally:  # a later run of the emulation must sum in its own order again
        engine.channels_last = False
        engine.module = in_memory_format(module, torch.contiguous_format)


def run_half_storage(
    engine: Engine, images: torch.Tensor, dtype: torch.dtype, batch_size: int = 64
) -> torch.Tensor:
    """`engine` (an eager float32 emulation) with every leaf module's output, and the
    parameters and buffers outside its FP8 layers, rounded to `dtype`; the arithmetic stays
    float32. Sums written in a module's own forward (a block's residual sum) stay float32
    until a leaf reads them.

    One correct implementation of the recipe that stores values in `dtype` between layers, as
    the half-precision engines do: FP8 rounding amplifies each such rounding as it amplifies a
    reordered fp32 sum, so its distance from the emulation is the floor for an engine that
    stores in `dtype`. The FP8 layers (`QDQ`) keep their weights (FP8 values whose float32
    scales the fused epilogue applies) and round only their output. Parameters and buffers are
    rounded in place and restored afterwards."""
    with half_storage(engine, dtype):
        return run_engine(engine, images, batch_size)


@contextmanager
def half_storage(engine: Engine, dtype: torch.dtype) -> Iterator[Engine]:
    """`engine` storing in `dtype` inside the block, as `run_half_storage` describes."""
    module = engine.module
    if not isinstance(module, nn.Module):
        raise TypeError(f"{engine.name}: half-precision storage needs an eager nn.Module")
    outputs, tensors = _stored_parts(module)
    saved = [(t, t.detach().clone()) for t in tensors]
    for t in tensors:
        t.data = t.data.to(dtype).to(t.dtype)
    hooks = [m.register_forward_hook(lambda _m, _i, out: _rounded(out, dtype)) for m in outputs]
    try:
        yield engine
    finally:
        for h in hooks:
            h.remove()
        for t, value in saved:
            t.data = value


def _stored_parts(module: nn.Module) -> tuple[list[nn.Module], list[torch.Tensor]]:
    """What a half-precision engine stores in its dtype: the outputs of the leaf modules and of
    the FP8 emulations (`QDQ`, as one unit), and the floating-point parameters and buffers of
    every other module (a BatchNorm's, say, whether or not it has children)."""
    outputs: list[nn.Module] = []
    tensors: list[torch.Tensor] = []

    def visit(m: nn.Module) -> None:
        if isinstance(m, QDQ):
            outputs.append(m)
            return
        own = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        tensors.extend(t for t in own if t.is_floating_point())
        children = list(m.children())
        if not children:
            outputs.append(m)
        for c in children:
            visit(c)

    visit(module)
    return outputs, tensors


def _rounded(out: object, dtype: torch.dtype) -> object:
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.to(dtype).to(out.dtype)
    return out
