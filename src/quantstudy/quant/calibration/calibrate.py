"""Static per-tensor activation scales from the fp32 model over the calibration set.

One quantizer per tensor: when two selected layers read the same tensor (a Res2Net block input
feeds both `conv1` and `downsample`; a GhostNet block input feeds the ghost conv and the shortcut),
they share one calibrator and one scale, as a deployed engine would quantize that tensor once.
Sharing is found by identity of the input tensor in the first calibration batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from quantstudy.quant.calibration.calibrators import BINS, Calibrator, make_calibrator
from quantstudy.quant.formats.fp8 import E4M3_MAX
from quantstudy.quant.graph.trace import PreHook, pre_hooks
from quantstudy.record import CalibrationInfo, TensorScale
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Calibrator as CalibratorName

# The headroom the search's option step tries and the options table measures: two binades
# above the calibration images' amax (the recipe schema's `activations.headroom` says why).
HEADROOM_TRIED = 4.0


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
    # float64; collected when asked, for compensating weight rounding (`quant/fitting/rounding.py`)
    second_moment: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # layer -> max |x| per input channel; what scale migration needs (`quant/fitting/migrate.py`)
    channel_amax: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # tensor key -> calibrator that set its amax, where a layer override chose another one
    tensor_calibrator: dict[str, str] = field(default_factory=dict)

    def with_headroom(self, headroom: float) -> Calibration:
        """Every amax multiplied by `headroom` (the recipe's `activations.headroom`): the clip
        values the scales are taken from."""
        if headroom == 1.0:
            return self
        return replace(self, amax={k: v * headroom for k, v in self.amax.items()})

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

    def pre_hook(name: str) -> PreHook:
        def hook(_m: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
            x = inp[0]
            for t, key in seen:
                if t is x:
                    groups[key].append(name)
                    return
            seen.append((x, name))
            groups[name] = [name]

        return hook

    with pre_hooks(model, [(name, pre_hook(name)) for name in layers]), torch.no_grad():
        model(batch)
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
    calibrator: str = CalibratorName.MAX,
    params: dict[str, float] | None = None,
    second_moments: list[str] | None = None,
    layer_calibrators: Mapping[str, str] | None = None,
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
    means = {
        name: _ChannelMean(isinstance(model.get_submodule(name), nn.Conv2d)) for name in layers
    }
    moments = {name: _SecondMoment() for name in second_moments or []}
    source = _STATS_SOURCE.get()
    if source is not None and not divisors:  # divided inputs are this plan's own: not shared
        stats, n_images = source(model, layers, itertools.chain([first], batches), [*moments])
        _restore(stats, cals, means, moments)
    else:
        n_images = _run_pass(
            model, itertools.chain([first], batches), cals, means, moments, divisors
        )
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


def _run_pass(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    cals: dict[str, Calibrator],
    means: dict[str, _ChannelMean],
    moments: dict[str, _SecondMoment],
    divisors: dict[str, torch.Tensor],
) -> int:
    """One forward pass over `batches` feeding every collector; returns the image count."""
    hooks: list[tuple[str, PreHook]] = []
    for key, cal in cals.items():
        dim = 1 if isinstance(model.get_submodule(key), nn.Conv2d) else -1
        hooks.append((key, _feeding(cal.collect, divisors.get(key), dim)))
    for collectors in (means, moments):
        hooks += [(name, _feeding(c.collect)) for name, c in collectors.items()]
    n_images = 0
    with pre_hooks(model, hooks), torch.no_grad():
        for batch in batches:
            model(batch)
            n_images += batch.shape[0]
    return n_images


# --- Observations shared between calibrations (the cache-facing surface) -------------------


@dataclass
class InputStats:
    """What calibration observes of one layer's input over the calibration images.

    Every registered calibrator's amax is a function of (`amax`, `hist`, `nonfinite`) alone:
    `max` reads `amax`, `percentile`, `mse` and `entropy` search the histogram of |x|, whose
    log-spaced bins are fixed (`calibrators.BINS`), not chosen per calibrator or parameter.
    So one observation serves every calibrator and parameter of a layer, and the per-channel
    statistics (means and max |x| for bias correction and migration, the second moment for
    compensating rounding) come from the same pass. What is not shareable: inputs divided by a
    plan's migration divisors (calibrated again by that plan), and another model, weights,
    preprocessing, calibration images, batch or device (any changes the fp32 inputs' bits).
    Tensors are on the CPU; sums float64, as the collectors keep them."""

    amax: float
    nonfinite: int
    hist: torch.Tensor  # float64 counts per log2 bin of |x| (`calibrators.BINS`)
    channel_sum: torch.Tensor  # float64 per input channel
    channel_amax: torch.Tensor  # float32 max |x| per input channel
    count: int  # values per channel summed in channel_sum
    second_sum: torch.Tensor | None = None  # float64 sum of x x^T, when asked for
    second_count: int = 0


StatsSource = Callable[
    [nn.Module, list[str], Iterator[torch.Tensor], list[str]], tuple[dict[str, InputStats], int]
]
"""(model, layers, batches, layers needing second moments) -> (stats per layer, image count).
A source may answer from stored observations without running the model; `observe` is the one
that runs it."""

_STATS_SOURCE: ContextVar[StatsSource | None] = ContextVar("calibration_stats", default=None)


@contextmanager
def stats_source(source: StatsSource | None) -> Iterator[None]:
    """Within the block, `calibrate` takes its (undivided) observations from `source`."""
    token = _STATS_SOURCE.set(source)
    try:
        yield
    finally:
        _STATS_SOURCE.reset(token)


def observe(
    model: nn.Module,
    layers: list[str],
    batches: Iterable[torch.Tensor],
    second_moments: list[str] | None = None,
) -> tuple[dict[str, InputStats], int]:
    """One pass of the fp32 `model` over `batches`: every statistic any calibrator needs of
    each layer's input (`InputStats`), with the histogram whatever the calibrator."""
    model.eval()
    cals = {name: Calibrator() for name in layers}
    for cal in cals.values():
        cal.uses_histogram = True
    means = {
        name: _ChannelMean(isinstance(model.get_submodule(name), nn.Conv2d)) for name in layers
    }
    moments = {name: _SecondMoment() for name in second_moments or []}
    n_images = _run_pass(model, batches, cals, means, moments, {})
    stats = {}
    for name in layers:
        cal, mean, moment = cals[name], means[name], moments.get(name)
        if mean.total is None or mean.amax is None:  # both are set by the same collect
            raise UserError(f"calibration: layer '{name}' never ran in a forward pass")
        second_sum = None
        if moment is not None:
            assert moment.total is not None  # the same pass collected it (the layer ran)
            second_sum = moment.total.cpu()
        hist = cal.hist if cal.hist is not None else torch.zeros(BINS, dtype=torch.float64)
        stats[name] = InputStats(
            amax=cal.amax,
            nonfinite=cal.nonfinite,
            hist=hist,
            channel_sum=mean.total.cpu(),
            channel_amax=mean.amax.cpu(),
            count=mean.count,
            second_sum=second_sum,
            second_count=moment.count if moment is not None else 0,
        )
    return stats, n_images


def _restore(
    stats: dict[str, InputStats],
    cals: dict[str, Calibrator],
    means: dict[str, _ChannelMean],
    moments: dict[str, _SecondMoment],
) -> None:
    """Put observed statistics into the collectors, as if they had run the pass themselves."""
    for key, cal in cals.items():
        s = stats[key]
        cal.amax, cal.nonfinite = s.amax, s.nonfinite
        cal.hist = s.hist.clone() if cal.uses_histogram else None
    for name, mean in means.items():
        s = stats[name]
        mean.total, mean.amax, mean.count = s.channel_sum, s.channel_amax, s.count
    for name, moment in moments.items():
        s = stats[name]
        if s.second_sum is None:
            raise ValueError(f"stats source gave no second moment for '{name}'")
        moment.total, moment.count = s.second_sum, s.second_count


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
    groups: dict[str, list[str]], overrides: Mapping[str, str], default: str
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


def _feeding(
    collect: Callable[[torch.Tensor], None], divisor: torch.Tensor | None = None, dim: int = -1
) -> PreHook:
    """A pre-hook handing the layer's first input, divided by `divisor` along `dim` where there
    is one, to `collect`."""
    return lambda _m, inp: collect(_divided(inp[0], divisor, dim))


def _divided(x: torch.Tensor, divisor: torch.Tensor | None, dim: int) -> torch.Tensor:
    """x / divisor along the channel dimension `dim` (a conv's 1, a linear's -1)."""
    if divisor is None:
        return x
    view = [1] * x.dim()
    view[dim] = -1
    return x / divisor.reshape(view).to(x.device, x.dtype)
