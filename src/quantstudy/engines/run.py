"""Run an engine over a set of images, in fixed-size batches, with a progress bar."""

from __future__ import annotations

import torch
from rich.progress import Progress

from quantstudy.engines.base import Engine


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
    finally:
        engine.channels_last = False
