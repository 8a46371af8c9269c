"""Random weights that make a working network: timm zero-initializes some layers (the
classifier heads of the MLP-Mixer family, for one), so a randomly initialized model would give
the same logits for every image and a study would refuse its fp32 reference. With random
weights, each conv or linear layer whose weight is all zeros gets random values too."""

from __future__ import annotations

import torch
from torch import nn

STD = 0.02  # timm's truncated-normal init for linear layers (e.g. `vision_transformer.py`)


def fill_zero_layers(model: nn.Module, seed: int) -> list[str]:
    """Give each conv or linear layer of `model` whose weight is all zeros a truncated-normal
    weight (std `STD`, seeded); returns their names, in module order."""
    filled = []
    generator = torch.Generator().manual_seed(seed)
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Conv2d)) or bool(module.weight.any()):
            continue
        with torch.no_grad():
            values = torch.randn(module.weight.shape, generator=generator) * STD
            module.weight.copy_(values.clamp_(-2 * STD, 2 * STD))
        filled.append(name)
    return filled
