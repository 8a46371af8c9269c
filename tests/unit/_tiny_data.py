"""A tiny ImageNet-style folder for the end-to-end study helpers: 2 classes (labels 0 and 1),
6 random 48x48 JPEGs each (by default), from a seeded generator so every test sees the same
pixels."""

from pathlib import Path

import torch
from PIL import Image


def write_tiny_imagenet(data: Path, seed: int, per_class: int = 6, size: int = 48) -> Path:
    g = torch.Generator().manual_seed(seed)
    for wnid in ("n01440764", "n01443537"):
        (data / wnid).mkdir(parents=True)
        for i in range(per_class):
            pixels = (torch.rand(size, size, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(data / wnid / f"img{i}.jpg")
    return data
