"""Held-out images streamed in chunks: decoded in parallel, held as uint8, normalised per batch.

A study at ImageNet scale cannot hold its held-out set as float32 (50,000 images at 224x224 are
30 GB), so the held-out pass reads it as a stream:

- decoding runs in `torch.utils.data.DataLoader` workers (processes: Pillow's resize holds the
  GIL for part of its work), in order, while the engines compute on the batch before;
- a worker returns the image resized and cropped as uint8 (a quarter of float32), pinned for a
  non-blocking copy when the engines run on a GPU;
- `normalize` turns a uint8 batch into the float32 the model reads, on the engines' device, with
  the very operations of timm's eval transform (`ToTensor`'s divide by 255, then `Normalize`'s
  subtract and divide), so a streamed batch equals `data/images.py: load_images` bit for bit;
- at most the chunk in flight and the loader's prefetched batches are in host memory.

The split of `EvalTransform` into a uint8 part and `normalize` is checked against timm's own
transform in the tests: a change of timm's eval pipeline fails there, not silently here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Normalize
from torchvision.transforms.functional import pil_to_tensor

from quantstudy.data.decode import to_rgb, usable_cores
from quantstudy.data.folders import ImageItem

# Host memory of the decode workers' prefetch: each worker keeps this many batches ready.
PREFETCH_BATCHES = 2


class Uint8Transform:
    """PIL image -> uint8 CHW tensor: timm's eval transform (`steps`, e.g.
    `model.preprocess.EvalTransform.steps`) up to, not including, its conversion to float; the
    mean and std of its final `Normalize` are kept for `normalize`. A class, so it pickles into
    the loader's workers."""

    def __init__(self, steps: list[Callable[..., Any]]) -> None:
        names = [type(s).__name__ for s in steps]
        if len(steps) < 2 or names[-2] not in ("ToTensor", "MaybeToTensor"):
            raise ValueError(f"unexpected timm eval transform {names}: cannot stream it as uint8")
        last = steps[-1]
        if not isinstance(last, Normalize):
            raise ValueError(f"unexpected timm eval transform {names}: it must end in Normalize")
        self._pil_steps = steps[:-2]
        # as `torchvision.transforms.functional.normalize` makes them from Normalize's values
        self.mean = torch.as_tensor(last.mean, dtype=torch.float32)
        self.std = torch.as_tensor(last.std, dtype=torch.float32)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        image = image.convert("RGB")
        for step in self._pil_steps:
            image = step(image)
        return pil_to_tensor(image)


def normalize(images: torch.Tensor, transform: Uint8Transform) -> torch.Tensor:
    """float32 NCHW model input of uint8 NCHW `images` cut by `transform`, on their device.

    The divisor 255 is a tensor on the images' device, not a Python number: CUDA divides by a
    host scalar as a multiplication by its reciprocal, which can differ in the last bit from the
    CPU's true division that `load_images` used."""
    device = images.device
    x = images.to(torch.float32).div(torch.tensor(255.0, device=device))
    mean = transform.mean.to(device).view(-1, 1, 1)
    std = transform.std.to(device).view(-1, 1, 1)
    return x.sub_(mean).div_(std)


class _Decoded(Dataset):
    """The uint8 images of `items`, decoded through `to_rgb` as the folder scan checked them."""

    def __init__(self, items: list[ImageItem], transform: Uint8Transform) -> None:
        self.items = items
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> torch.Tensor:
        with Image.open(self.items[index].path) as image:
            return self.transform(to_rgb(image))


def _one_thread(_worker: int) -> None:
    torch.set_num_threads(1)  # a worker decodes; the main process computes


@dataclass(frozen=True)
class Chunk:
    """Consecutive held-out images: `start` is the index of the first, `batches` are uint8."""

    start: int
    batches: list[torch.Tensor]

    @property
    def n_images(self) -> int:
        return sum(b.shape[0] for b in self.batches)


def decode_workers() -> int:
    """Decode workers: the cores beside the computing process, at most 8, at least 0 (decode in
    the main process on a one-core machine)."""
    return max(0, min(8, usable_cores() - 1))


def stream_chunks(
    items: list[ImageItem],
    transform: Uint8Transform,
    *,
    batch_size: int,
    chunk_batches: int,
    start: int = 0,
    workers: int | None = None,
    pin_memory: bool = False,
) -> Iterator[Chunk]:
    """The uint8 images of `items[start:]` in chunks of `chunk_batches` batches of `batch_size`.

    `start` must be a chunk boundary (a resumed study skips the chunks it has). Batches are cut
    from the start of `items`, so every batch but the last is full."""
    chunk = batch_size * chunk_batches
    rest = items[start:]
    if not rest:
        return
    if start % chunk:
        raise ValueError(f"start {start} is not a multiple of the chunk size {chunk}")
    workers = decode_workers() if workers is None else workers
    loader = DataLoader(
        _Decoded(rest, transform),
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin_memory,
        worker_init_fn=_one_thread if workers else None,
        prefetch_factor=PREFETCH_BATCHES if workers else None,
    )
    batches: list[torch.Tensor] = []
    first = start
    for batch in loader:
        batches.append(batch)
        if len(batches) == chunk_batches:
            yield Chunk(first, batches)
            first += chunk
            batches = []
    if batches:
        yield Chunk(first, batches)
