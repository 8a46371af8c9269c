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
    # layer -> E[x x^T] over its input channels (every position of every calibration image),
    # float64; collected when asked, for compensating weight rounding (`quant/rounding.py`)
    second_moment: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # layer -> max |x| per input channel; what scale migration needs (`quant/migrate.py`)
    channel_amax: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # tensor key -> calibrator that set its amax, where a layer override chose another one
    tensor_calibrator: dict[str, str] = field(default_factory=dict)

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
                    calibrator=self.tensor_calibrator.get(key),
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
    second_moments: list[str] | None = None,
    layer_calibrators: dict[str, str] | None = None,
    divisors: dict[str, torch.Tensor] | None = None,
) -> Calibration:
    """Observe the inputs of `layers` in the fp32 `model` over `batches`; one amax per tensor,
    and the input second moment of each layer of `second_moments`.

    `layer_calibrators` (layer -> calibrator, its default parameters) overrides `calibrator` for
    the tensor that layer reads; consumers of one tensor must not ask for different ones.
    `divisors` (layer -> per-channel divisor, scale migration) calibrates that layer's tensor
    as the layer quantizes it, divided."""
    params = dict(params or {})
    model.eval()
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        raise UserError("calibration set is empty: give at least one calibration image")
    groups = _group_consumers(model, layers, first)
    chosen = _tensor_calibrators(groups, layer_calibrators or {}, calibrator)
    divisors = divisors or {}
    cals: dict[str, Calibrator] = {
        key: make_calibrator(chosen[key], {})
        if key in chosen
        else make_calibrator(calibrator, params)
        for key in groups
    }
    hooks = []
    for key, cal in cals.items():
        layer = model.get_submodule(key)
        dim = 1 if isinstance(layer, nn.Conv2d) else -1
        divisor = divisors.get(key)
        hooks.append(
            layer.register_forward_pre_hook(
                lambda _m, inp, cal=cal, d=divisor, dim=dim: cal.collect(_divided(inp[0], d, dim))
            )
        )
    means = {
        name: _ChannelMean(isinstance(model.get_submodule(name), nn.Conv2d)) for name in layers
    }
    hooks += [
        model.get_submodule(name).register_forward_pre_hook(lambda _m, inp, m=m: m.collect(inp[0]))
        for name, m in means.items()
    ]
    moments = {name: _SecondMoment() for name in second_moments or []}
    hooks += [
        model.get_submodule(name).register_forward_pre_hook(lambda _m, inp, m=m: m.collect(inp[0]))
        for name, m in moments.items()
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
    channel_amax = {name: m.amax.cpu() for name, m in means.items() if m.amax is not None}
    second = {name: m.moment() for name, m in moments.items()}
    return Calibration(
        calibrator, params, n_images, groups, amax, channel_mean, second, channel_amax, chosen
    )


class _ChannelMean:
    """Running per-channel sum of a layer's input, reduced in float64 where it lives: no copy of
    the input and no device sync per batch."""

    def __init__(self, conv: bool) -> None:
        self.channel_dim = 1 if conv else -1
        self.total: torch.Tensor | None = None
        self.amax: torch.Tensor | None = None
        self.count = 0

    def collect(self, x: torch.Tensor) -> None:
        dims = [d for d in range(x.dim()) if d != self.channel_dim % x.dim()]
        s = x.detach().sum(dim=dims, dtype=torch.float64)
        a = x.detach().abs().amax(dim=dims).float()
        self.total = s if self.total is None else self.total + s
        self.amax = a if self.amax is None else torch.maximum(self.amax, a)
        self.count += x.numel() // x.shape[self.channel_dim]

    def mean(self) -> torch.Tensor:
        assert self.total is not None  # every layer ran (checked by _group_consumers)
        return (self.total / self.count).float().cpu()


class _SecondMoment:
    """Running sum of x x^T over a layer's input channels (a conv's dim 1, a linear's last dim),
    each batch's product in float32 where it lives, summed in float64."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    def collect(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        rows = x.movedim(1, -1) if x.dim() == 4 else x
        rows = rows.reshape(-1, rows.shape[-1])
        s = (rows.t() @ rows).double()
        self.total = s if self.total is None else self.total + s
        self.count += rows.shape[0]

    def moment(self) -> torch.Tensor:
        assert self.total is not None  # every layer ran (checked by _group_consumers)
        return (self.total / self.count).cpu()


def _tensor_calibrators(
    groups: dict[str, list[str]], overrides: dict[str, str], default: str
) -> dict[str, str]:
    """Tensor key -> calibrator (default parameters), for tensors whose consumers override the
    recipe's default."""
    unknown = sorted(set(overrides) - {n for c in groups.values() for n in c})
    if unknown:
        raise UserError(
            f"layer_calibrators names layers that are not selected: {unknown[:5]}; "
            "use names from the recipe's layer table"
        )
    chosen = {}
    for key, consumers in groups.items():
        asked = {overrides[n] for n in consumers if n in overrides}
        if len(asked) > 1:
            raise UserError(
                f"layer_calibrators: {', '.join(consumers)} read one tensor (one quantizer) but "
                f"ask for calibrators {sorted(asked)}; give them the same one"
            )
        if asked and asked != {default}:
            chosen[key] = asked.pop()
    return chosen


def _divided(x: torch.Tensor, divisor: torch.Tensor | None, dim: int) -> torch.Tensor:
    """x / divisor along the channel dimension `dim` (a conv's 1, a linear's -1)."""
    if divisor is None:
        return x
    view = [1] * x.dim()
    view[dim] = -1
    return x / divisor.reshape(view).to(x.device, x.dtype)
