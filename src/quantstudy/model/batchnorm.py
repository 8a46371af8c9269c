"""Re-estimate BatchNorm statistics of a randomly initialised model on real images.

timm's random init leaves every BatchNorm at mean 0, variance 1 while the real activations grow
layer by layer past fp16's 65504: examples/mobilenetv4_conv_large-random-h200, a study made
without this re-estimation, has non-finite fp16 and FP8 logits on every input. Setting the
running statistics to those of the calibration images keeps activations at the scale a trained
network has, which is what a speed-only study needs. Weights are untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def reestimate_batchnorm(model: nn.Module, batches: Iterable[torch.Tensor]) -> int:
    """Replace every BatchNorm's running statistics by their average over `batches`.

    Returns the number of BatchNorm layers updated. The model is left in eval mode.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m, m.momentum) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch weighs the same
    model.eval()
    for m in norms:
        m.train()
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        model.eval()
    return len(norms)
