"""The held-out pass, streamed: every engine on each chunk of images, per-image rows kept.

The images are decoded once (`data/stream.py`), chunk by chunk, and each chunk goes through
every engine before the next is read, so every engine sees the same input tensors and host
memory holds one uint8 chunk, not the whole set as float32. Of each engine's logits only the
per-image rows the quality section reads are kept (`quality/image_scores.py`); a chunk's rows are
written to the study's cache as soon as the chunk is done, so an interrupted study resumes at
the first chunk it has no rows for and loses at most the chunk in flight.

The batches are those of `engines/run.py: run_engine` over the whole set (a chunk is a whole
number of batches, the last batch of the set is padded), so a streamed study's records equal
those of a study that held every image in memory, bit for bit (tests/unit/test_study_stream.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from quantstudy.data.folders import ImageItem
from quantstudy.data.stream import Chunk, Uint8Transform, normalize, stream_chunks
from quantstudy.engines.base import Engine
from quantstudy.engines.run import device_logits, padded
from quantstudy.quality.image_scores import Pair, RowSet
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.study.cache import StageCache, console

# Images per chunk, in eval batches: the unit of resumption and of host memory (uint8).
CHUNK_IMAGES = 1024

StopRule = Callable[[RowSet, "np.ndarray | None"], bool]
"""Called after each chunk with the rows and labels of every image so far: True stops the pass
(a sequential study's look, `study/rounds.py`)."""


@dataclass(frozen=True)
class EnginePass:
    """One engine's pass over the held-out images; `around` wraps each chunk's pass (an
    emulation run again channels-last, or storing in half precision)."""

    name: str
    engine: Engine
    around: Callable[[], AbstractContextManager[object]] = nullcontext


@dataclass
class HeldoutResult:
    """The rows of every engine and pair over the held-out set, and where the time went."""

    rows: RowSet
    labels: np.ndarray | None  # of the images in `rows`
    seconds: dict[str, float] = field(default_factory=dict)  # engine name or "decode" -> s
    resumed_images: int = 0
    stopped: bool = False  # the stop rule ended the pass before the last image

    @property
    def n_images(self) -> int:
        return self.rows.n_images


def chunk_batches(eval_batch: int, images: int | None = None) -> int:
    """Eval batches per chunk: about `images` (default `CHUNK_IMAGES`), at least one batch."""
    return max(1, (images or CHUNK_IMAGES) // eval_batch)


def labels_of(items: list[ImageItem]) -> np.ndarray | None:
    """The int64 labels of `items`, or None when any is unlabelled (as `load_images`)."""
    if not all(item.label is not None for item in items):
        return None
    labels: np.ndarray = np.asarray([item.label for item in items], dtype=np.int64)
    return labels


def run_heldout(
    passes: list[EnginePass],
    pairs: list[Pair],
    items: list[ImageItem],
    transform: Uint8Transform,
    *,
    eval_batch: int,
    device: torch.device,
    cache: StageCache | None,
    workers: int | None = None,
    chunk_images: int | None = None,
    stop: StopRule | None = None,
    reference_check: Callable[[torch.Tensor], None] | None = None,
) -> HeldoutResult:
    """Run every pass over `items`, chunk by chunk; resume from the chunks in `cache`.

    `chunk_images`: images per chunk (rounded down to whole eval batches). `stop`: asked after
    every chunk, resumed ones included, whether to end the pass there. `reference_check`: called
    with each chunk's fp32 logits before any row is kept, so a broken reference is refused before
    an engine is judged against it."""
    labels = labels_of(items)
    per_chunk = chunk_batches(eval_batch, chunk_images)
    size = eval_batch * per_chunk
    done: list[RowSet] = []

    def seen() -> tuple[RowSet, np.ndarray | None]:
        rows = RowSet.concat(done)
        return rows, None if labels is None else labels[: rows.n_images]

    while cache is not None and len(done) * size < len(items):
        stored = cache.get_tensors(_chunk_name(len(done) * size))
        if stored is None:
            break
        done.append(RowSet.from_tensors(stored))
        n = len(done) * size
        if stop is not None and stop(*seen()) and n < len(items):
            console.print(f"[dim]resumed the rows of {n} held-out images from the cache[/dim]")
            return HeldoutResult(*seen(), {}, n, stopped=True)
    start = min(len(done) * size, len(items))
    if start:
        console.print(f"[dim]resumed the rows of {start} held-out images from the cache[/dim]")
    seconds = {p.name: 0.0 for p in passes} | {"decode": 0.0}
    chunks = stream_chunks(
        items,
        transform,
        batch_size=eval_batch,
        chunk_batches=per_chunk,
        start=start,
        workers=workers,
        pin_memory=device.type == "cuda",
    )
    with _progress() as progress:
        task = progress.add_task("held-out", total=len(items), completed=start)
        while True:
            t0 = time.perf_counter()
            chunk = next(chunks, None)
            seconds["decode"] += time.perf_counter() - t0
            if chunk is None:
                break
            logits = {}
            for p in passes:
                t0 = time.perf_counter()
                logits[p.name] = _chunk_logits(p, chunk, transform, len(items), eval_batch, device)
                seconds[p.name] += time.perf_counter() - t0
                if p.name == EngineName.FP32 and reference_check is not None:
                    reference_check(logits[p.name])
            end = chunk.start + chunk.n_images
            rows = RowSet.of(logits, pairs, None if labels is None else labels[chunk.start : end])
            if cache is not None:
                cache.put_tensors(_chunk_name(chunk.start), rows.to_tensors())
            done.append(rows)
            progress.update(task, completed=end)
            if stop is not None and stop(*seen()) and end < len(items):
                return HeldoutResult(*seen(), seconds, start, stopped=True)
    return HeldoutResult(*seen(), seconds, start)


def _chunk_logits(
    p: EnginePass,
    chunk: Chunk,
    transform: Uint8Transform,
    total: int,
    eval_batch: int,
    device: torch.device,
) -> torch.Tensor:
    """One engine's float32 logits of one chunk, on the host: the batches stay on the device
    until the chunk is done (one copy, one synchronisation per chunk and engine)."""
    outs = []
    with p.around():
        for batch in chunk.batches:
            real = batch.shape[0]
            x = normalize(padded(batch, eval_batch, total).to(device, non_blocking=True), transform)
            outs.append(device_logits(p.engine, x)[:real])
    return torch.cat(outs).cpu()


def first_images(
    items: list[ImageItem], transform: Uint8Transform, n: int, eval_batch: int
) -> torch.Tensor:
    """The first `n` held-out images as float32 on the host (the timing harness's inputs),
    decoded the way the streamed pass decodes them."""
    parts = []
    for chunk in stream_chunks(
        items[:n], transform, batch_size=eval_batch, chunk_batches=1, workers=0
    ):
        parts += [normalize(b, transform) for b in chunk.batches]
    return torch.cat(parts)


def _chunk_name(start: int) -> str:
    return f"rows-{start:08d}"


def _progress() -> Progress:
    columns = (TextColumn("held-out"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, transient=True)
