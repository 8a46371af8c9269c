"""Static per-tensor activation scales from the fp32 model over the calibration set.

One quantizer per tensor: when two selected layers read the same tensor (a Res2Net block input
feeds both `conv1` and `downsample`; a GhostNet block input feeds the ghost conv and the shortcut),
they share one calibrator and one scale, as a deployed engine would quantize that tensor once.
Sharing is found by identity of the input tensor in the first calibration batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from quantstudy.quant.calibrators import Calibrator, make_calibrator
from quantstudy.quant.fp8 import E4M3_MAX
from quantstudy.record import CalibrationInfo, TensorScale
from quantstudy.record.errors import UserError


@dataclass(frozen=True)
class Calibration:
    """Activation amax per selected layer, with the tensor groups that share a scale."""

    calibrator: str
    params: dict[str, float]
    n_images: int
    groups: dict[str, list[str]]  # tensor key (first consumer) -> consumers
    amax: dict[str, float]  # tensor key -> amax
    # layer -> mean of its input per channel (dim 1 of a conv input, last dim of a linear's)
    # over the calibration images; what weight bias correction needs
    channel_mean: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)

    def scale_of(self, layer: str) -> float:
        """Scale (amax/448) of the tensor that `layer` reads."""
        for key, consumers in self.groups.items():
            if layer in consumers:
                return self.amax[key] / E4M3_MAX
        raise KeyError(f"layer {layer} was not calibrated")

    def info(self, with_means: bool = False) -> CalibrationInfo:
        """The calibration section of the record; `with_means` adds each tensor's per-channel
        mean (needed to rebuild a weight bias correction from the record)."""
        return CalibrationInfo(
            calibrator=self.calibrator,
            params=self.params,
            n_images=self.n_images,
            tensors=[
                TensorScale(
                    tensor=f"{key}:input",
                    consumers=self.groups[key],
                    amax=self.amax[key],
                    scale=self.amax[key] / E4M3_MAX,
                    channel_mean=(
                        self.channel_mean[key].tolist()
                        if with_means and key in self.channel_mean
                        else None
                    ),
                )
                for key in self.groups
            ],
        )


def _group_consumers(
    model: nn.Module, layers: list[str], batch: torch.Tensor
) -> dict[str, list[str]]:
    """Group selected layers by the identity of the tensor they read, in first-use order."""
    seen: list[tuple[torch.Tensor, str]] = []
    groups: dict[str, list[str]] = {}
    hooks = []

    def pre_hook(name: str):
        def hook(_m, inp):
            x = inp[0]
            for t, key in seen:
                if t is x:
                    groups[key].append(name)
                    return
            seen.append((x, name))
            groups[name] = [name]

        return hook

    for name in layers:
        hooks.append(model.get_submodule(name).register_forward_pre_hook(pre_hook(name)))
    try:
        with torch.no_grad():
            model(batch)
    finally:
        for h in hooks:
            h.remove()
    missing = [n for n in layers if not any(n in c for c in groups.values())]
    if missing:
        raise UserError(
            "selected layers never ran in a forward pass, so they cannot be calibrated: "
            f"{missing[:5]}"
        )
    return groups


def calibrate(
    model: nn.Module,
    layers: list[str],
    batches: Iterable[torch.Tensor],
    calibrator: str = "max",
    params: dict[str, float] | None = None,
) -> Calibration:
    """Observe the inputs of `layers` in the fp32 `model` over `batches`; one amax per tensor."""
    params = dict(params or {})
    model.eval()
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        raise UserError("calibration set is empty: give at least one calibration image")
    groups = _group_consumers(model, layers, first)
    cals: dict[str, Calibrator] = {key: make_calibrator(calibrator, params) for key in groups}
    hooks = [
        model.get_submodule(key).register_forward_pre_hook(
            lambda _m, inp, cal=cal: cal.collect(inp[0])
        )
        for key, cal in cals.items()
    ]
    means = {
        name: _ChannelMean(isinstance(model.get_submodule(name), nn.Conv2d)) for name in layers
    }
    hooks += [
        model.get_submodule(name).register_forward_pre_hook(lambda _m, inp, m=m: m.collect(inp[0]))
        for name, m in means.items()
    ]
    n_images = 0
    try:
        with torch.no_grad():
            for batch in (first, *batches):
                model(batch)
                n_images += batch.shape[0]
    finally:
        for h in hooks:
            h.remove()
    amax: dict[str, float] = {}
    for key, cal in cals.items():
        value = cal.compute_amax()
        if cal.nonfinite:
            raise UserError(
                f"calibration: the input of '{key}' had {cal.nonfinite} non-finite values in the "
                "fp32 model; fix the model or its weights before quantizing"
            )
        if not (value > 0 and value < float("inf")):
            raise UserError(
                f"calibration: amax of the input of '{key}' is {value}; a zero or non-finite amax "
                "gives no usable FP8 scale. Exclude this layer in the recipe"
            )
        amax[key] = value
    channel_mean = {name: m.mean() for name, m in means.items()}
    return Calibration(calibrator, params, n_images, groups, amax, channel_mean)


class _ChannelMean:
    """Running per-channel sum of a layer's input, reduced in float64 where it lives: no copy of
    the input and no device sync per batch."""

    def __init__(self, conv: bool) -> None:
        self.channel_dim = 1 if conv else -1
        self.total: torch.Tensor | None = None
        self.count = 0

    def collect(self, x: torch.Tensor) -> None:
        dims = [d for d in range(x.dim()) if d != self.channel_dim % x.dim()]
        s = x.detach().sum(dim=dims, dtype=torch.float64)
        self.total = s if self.total is None else self.total + s
        self.count += x.numel() // x.shape[self.channel_dim]

    def mean(self) -> torch.Tensor:
        assert self.total is not None  # every layer ran (checked by _group_consumers)
        return (self.total / self.count).float().cpu()
