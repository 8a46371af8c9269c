"""Tiny models for the search tests, with one layer that can be made fragile on purpose."""

import torch
from torch import nn

LAYERS = ["0", "2", "4", "6", "10"]  # the conv/linear layers of `small_net`, in forward order
FRAGILE = "4"


def small_net(seed: int = 0) -> nn.Sequential:
    """conv3x3 -> 1x1 -> 1x1 -> 1x1 -> pool -> linear, ReLU between; random weights, eval mode."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).eval()
    with torch.no_grad():
        net[10].weight.mul_(30.0)  # logits far enough apart that KL and top-1 see changes
        # Channel 0 of layer 2's output is always exactly 0 after the ReLU (see make_fragile).
        net[2].weight[0].zero_()
        net[2].bias[0] = -1e3
    return net


def make_fragile(net: nn.Sequential, outlier: float = 1e7) -> None:
    """Give layer 4 one huge weight per output channel, on an input channel that is always 0.

    Channel 0 of layer 2's output is 0 after the ReLU for every input, so the float model
    computes exactly the same function as before. Per-output-channel FP8 scales are set by the
    outlier, so every ordinary weight of layer 4 underflows to zero once quantized.
    """
    with torch.no_grad():
        net[4].weight[:, 0] = outlier
