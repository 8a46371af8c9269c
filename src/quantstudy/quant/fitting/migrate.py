"""Scale migration (SmoothQuant-style) between an FP8 layer's input channels and its weights.

A layer y = W x computes the same as y = (W diag(d)) (x / d) for any positive per-input-channel
d. SmoothQuant (Xiao et al., 2023) picks d_c = max|x_c|^alpha / max|W_:,c|^(1 - alpha) so that
channels with outlier activations hand part of their range to the weights, which the INT8
per-tensor activation grid then resolves better. Here the division by d is done by the FP8
layer itself, just before its input quantize (Inductor fuses it into the producing kernel), and
the stored weight is W diag(d): the float network is unchanged whatever produced x (no linear
producer needs to exist, so a residual sum or a ReLU6 output can be migrated too).

Where it applies: a linear or dense 1x1 conv whose input tensor no other selected layer reads (a
shared tensor has one quantizer, so one divisor could not suit two weights). Channels never
seen non-zero, or whose weights are all zero, keep d = 1.

On FP8's grid the effect is smaller than on INT8's: E4M3 rounds relative to each value's own
magnitude, so rescaling a channel changes its rounding only through where its values fall on
the 3-bit mantissa and where the per-tensor scale puts the subnormal and saturation edges;
`tests/data/test_fp8_quality_options.py` measures it.

Exactness: the float model with every migration applied (the weight multiplied by d, its input
divided by d, in float32) must match the original to float32 tolerance (`RTOL`, `ATOL` on the
logits) on the example and on a seeded wide random input; layers whose migration breaks that are
dropped (`exact_divisors`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from quantstudy.quant.calibration.calibrate import Calibration
from quantstudy.quant.fitting.rounding import compensable
from quantstudy.quant.graph.edit import replace_module

RTOL, ATOL = 1e-4, 1e-4


def smooth_divisors(
    model: nn.Module, layers: list[str], calibration: Calibration, alpha: float
) -> dict[str, torch.Tensor]:
    """layer -> d (float32, one per input channel) for the migratable layers of `layers` in the
    float32 `model` (BatchNorm folded as the engines fold it)."""
    out = {}
    for key, consumers in calibration.groups.items():
        if len(consumers) != 1:
            continue
        layer = model.get_submodule(key)
        if not compensable(layer) or key not in calibration.channel_amax:
            continue
        w = layer.weight.detach().float().reshape(layer.weight.shape[0], -1).abs().amax(dim=0)
        x = calibration.channel_amax[key].float()
        d = x.pow(alpha) / w.pow(1 - alpha)
        ok = (x > 0) & (w > 0) & torch.isfinite(d) & (d > 0)
        out[key] = torch.where(ok, d, torch.ones_like(d))
    return {k: v for k, v in out.items() if k in layers}


class _Migrated(nn.Module):
    """The float layer computing W diag(d) (x / d): what a migrated FP8 layer approximates."""

    def __init__(self, layer: nn.Module, divisor: torch.Tensor) -> None:
        super().__init__()
        self.inner = copy.deepcopy(layer)
        view = (1, -1) + (1,) * (layer.weight.dim() - 2)
        with torch.no_grad():
            self.inner.weight.mul_(divisor.reshape(view).to(layer.weight.dtype))
        self.conv = isinstance(layer, nn.Conv2d)
        self.register_buffer("divisor", divisor.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        view = [1] * x.dim()
        view[1 if self.conv else -1] = -1
        return self.inner(x / self.divisor.reshape(view).to(x.dtype))


def with_migration(model: nn.Module, divisors: dict[str, torch.Tensor]) -> nn.Module:
    """A float copy of `model` with each layer of `divisors` migrated."""
    trial = copy.deepcopy(model)
    for name, d in divisors.items():
        replace_module(trial, name, _Migrated(trial.get_submodule(name), d))
    return trial


def _probes(example: torch.Tensor) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(example.shape, generator=g).to(example.device, example.dtype) * 3
    return [example, noise]


def exact_divisors(
    model: nn.Module, example: torch.Tensor, divisors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The divisors whose migration leaves the float `model`'s output equal to float32
    tolerance on the example and a wide random input: all if that holds together, else those
    that pass alone, if they also pass together; else none."""
    if not divisors:
        return {}
    probes = _probes(example)
    with torch.no_grad():
        refs = [model.eval()(x) for x in probes]

    def equal(chosen: dict[str, torch.Tensor]) -> bool:
        trial = with_migration(model, chosen).eval()
        with torch.no_grad():
            return all(
                torch.allclose(trial(x), ref, rtol=RTOL, atol=ATOL)
                for x, ref in zip(probes, refs, strict=True)
            )

    if equal(divisors):
        return divisors
    kept = {k: v for k, v in divisors.items() if equal({k: v})}
    return kept if kept and equal(kept) else {}
