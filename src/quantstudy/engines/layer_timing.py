"""One layer timed in fp16 against FP8: the sides and the one routine that times them, used by
the search's per-layer table (`search/layer_speed.py`) and the kernel choice
(`engines/kernel_choice.py`), so the two cannot disagree on what a layer costs.

- The fp16 side (`fp16_side`): the float layer as the fp16 engine runs it, in the engine's
  dtype, channels-last, followed by the FP8 layer's epilogue as separate ops (`Unfused.like`):
  the absorbed activation and, for a residual layer, the sum and its activation.
- The FP8 sides: the FP8 layer of each kernel timed, as the caller built it.

`time_layer` times the sides on one input in interleaved rounds of CUDA-graph replays
(`engines/interleaved.py`); the median and quartiles come from the rounds. What differs between
the callers is a parameter, stated where each calls: the input (a random one of the layer's
shape, or the real activation captured in place) and whether the input quantize counts (timed
alone in the same rounds and subtracted from each FP8 side, round by round, where it does not).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from quantstudy.engines.base import in_memory_format
from quantstudy.engines.interleaved import time_interleaved, timing_stats
from quantstudy.engines.unfused import Unfused
from quantstudy.quant.formats.fp8 import to_fp8
from quantstudy.record import TimingStats
from quantstudy.record.vocab import Engine

QUANTIZE = "quantize"  # the input quantize timed alone, where it is subtracted
Timer = Callable[[Callable[[], object]], float]
"""A stand-in clock (tests): one callable's time in us, called once per side."""


def fp16_side(
    layer: nn.Module, fp8: nn.Module, dtype: torch.dtype, device: torch.device
) -> Unfused:
    """The float `layer` (the fp16 engine's, float32) in `dtype` on `device`, channels-last, with
    the epilogue of the FP8 layer `fp8` it stands against."""
    half = copy.deepcopy(layer).to(device, dtype)
    return Unfused.like(in_memory_format(half, torch.channels_last), fp8)


@dataclass(frozen=True)
class LayerTimes:
    """us per call of each side, one value per round (rounds paired across sides); the FP8
    sides with the input quantize subtracted where it does not count."""

    us: dict[str, list[float]]

    def ms(self, side: str) -> list[float]:
        return [t / 1000 for t in self.us[side]]

    def stats(self, side: str) -> TimingStats:
        """Median, quartiles, min and max over the rounds, in us."""
        return timing_stats(self.us[side])

    def median(self, side: str) -> float | None:
        """The median in us; None: `side` was not timed."""
        return self.stats(side).median if side in self.us else None


def time_layer(
    fp16: Callable[..., object],
    fp8: Mapping[str, Callable[..., object]],
    args: tuple[torch.Tensor, ...],
    *,
    quantize_scale: torch.Tensor | float | None,
    rounds: int,
    iters: int,
    warmup: int,
    device: torch.device,
    timer: Timer | None = None,
) -> LayerTimes:
    """Time `fp16` (under the name "fp16") and each FP8 side of `fp8` on `args` (the layer's
    input, then a residual layer's residual). `quantize_scale`: None, the input quantize counts
    (it is inside the FP8 sides' calls); else the FP8 sides' input scale, and the quantize
    `to_fp8(input, scale)` is timed alone and subtracted. `timer`: a stand-in clock that times
    each callable once, in the order quantize, FP8 sides, fp16 (tests); None: interleaved
    CUDA-graph rounds on `device`."""
    calls: dict[str, Callable[[], object]] = {}
    if quantize_scale is not None:
        calls[QUANTIZE] = lambda: to_fp8(args[0], quantize_scale)
    for name, side in [*fp8.items(), (Engine.FP16.value, fp16)]:
        calls[name] = lambda side=side: side(*args)  # type: ignore[misc]
    with torch.no_grad():
        if timer is not None:
            us = {name: [timer(call)] for name, call in calls.items()}
        else:
            for call in calls.values():
                call()  # compiles and autotunes before the rounds, outside the graphs
            ms = time_interleaved(calls, rounds, iters, warmup, device=device)
            us = {name: [1000 * t for t in times] for name, times in ms.items()}
    shared = us.pop(QUANTIZE, None)
    if shared is not None:
        for name in fp8:
            us[name] = [max(t - q, 0.0) for t, q in zip(us[name], shared, strict=True)]
    return LayerTimes(us)
