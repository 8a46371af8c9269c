"""Tiny CNNs and images shared by the quantization-option tests (rounding, migration,
calibration statistics, the propagated fit): a 3x3 stem with BatchNorm and ReLU6, then 1x1 convs
with BatchNorm and activations and a pooled linear head, as a MobileNet block; small enough for
CPU."""

import torch
from torch import nn

LAYERS = ["3", "6", "9"]  # the 1x1 convs of both nets; in `deep_net`, 3 and 6 feed activations


def _stem() -> list[nn.Module]:
    return [nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU6()]


def _head(channels: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]


def pointwise_net() -> nn.Sequential:
    """stem -> 1x1 (BN, ReLU) -> 1x1 -> pool -> linear; seeded random weights, eval mode."""
    torch.manual_seed(0)
    mid = [nn.Conv2d(32, 48, 1), nn.BatchNorm2d(48), nn.ReLU(), nn.Conv2d(48, 32, 1)]
    return nn.Sequential(*_stem(), *mid, *_head(32)).eval()


def deep_net() -> nn.Sequential:
    """stem -> 1x1 (BN, in-place ReLU6) -> 1x1 (BN, ReLU) -> 1x1 -> pool -> linear: timm's
    activations work in place, which a fit that hooks activations must not be fooled by."""
    torch.manual_seed(0)
    mid = [
        *(nn.Conv2d(32, 48, 1), nn.BatchNorm2d(48), nn.ReLU6(inplace=True)),
        *(nn.Conv2d(48, 32, 1), nn.BatchNorm2d(32), nn.ReLU()),
        nn.Conv2d(32, 24, 1),
    ]
    return nn.Sequential(*_stem(), *mid, *_head(24)).eval()


def images() -> torch.Tensor:
    """24 seeded 12x12 images with correlated channels and a positive mean, as after a block."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(24, 3, 12, 12, generator=g) + torch.randn(24, 3, 1, 1, generator=g)
