"""Decode and transform a list of items into one tensor, with a progress bar.

Every image goes through `data/decode.py: to_rgb`, the conversion the folder scan checked. The
whole set is held in memory (1300 images at 224x224 float32 is about 780 MB) so every engine
sees the very same input tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from quantstudy.data.decode import to_rgb
from quantstudy.data.folders import ImageItem


def load_images(
    items: list[ImageItem],
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int = 64,
    desc: str = "",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (float32 NCHW images, int64 labels or None when any item is unlabelled)."""
    if not items:
        raise ValueError("load_images needs at least one item")  # callers check sizes first
    images: torch.Tensor | None = None
    columns = (
        TextColumn(desc or "images"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(desc, total=len(items))
        for start in range(0, len(items), batch_size):
            batch = items[start : start + batch_size]
            tensors = [_load_one(item, transform) for item in batch]
            if images is None:  # allocate once, from the first image's shape
                images = torch.empty((len(items), *tensors[0].shape), dtype=torch.float32)
            images[start : start + len(batch)] = torch.stack(tensors)
            progress.update(task, advance=len(batch))
    labelled = all(item.label is not None for item in items)
    labels = torch.tensor([item.label for item in items], dtype=torch.int64) if labelled else None
    return images, labels


def _load_one(item: ImageItem, transform: Callable[[Image.Image], torch.Tensor]) -> torch.Tensor:
    with Image.open(item.path) as image:
        return transform(to_rgb(image)).to(torch.float32)
