"""Multiply-accumulates of a model's conv and linear layers, counted by forward hooks.

What a leaderboard's GMACs column needs: a figure from the model itself at the input size the
study runs, not a number copied from elsewhere. Each `nn.Conv2d` contributes output elements x
(input channels / groups) x kernel area, each `nn.Linear` output elements x input features,
both at batch 1 (timm's `Conv2dSame` and other subclasses included). What hooks on these two
module types cannot see is left out and said so where the figure is shown: attention's own
matmuls (q @ k and attn @ v), functional convs and linears, and the elementwise work.
"""

from __future__ import annotations

import torch
from torch import nn


def count_macs(model: nn.Module, example: torch.Tensor) -> int:
    """Conv and linear multiply-accumulates of one forward pass of `model` on `example`, per image.

    Runs the model once (no gradient) where it and `example` are; the model is unchanged."""
    total = [0]

    def conv(module: nn.Conv2d, _inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        kh, kw = module.kernel_size
        per_output = module.in_channels // module.groups * kh * kw
        total[0] += out.numel() * per_output

    def linear(module: nn.Linear, _inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        total[0] += out.numel() * module.in_features

    handles = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(conv))
        elif isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(linear))
    try:
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return int(total[0]) // max(1, int(example.shape[0]))
