"""Activation calibrators: each turns observed values of one tensor into an amax (clip value).

Protocol (after Model Optimizer): `collect(x)` for every calibration batch, then `compute_amax()`.
Calibrators that need the distribution, not only the maximum, keep a histogram of |x| with
fixed log-spaced bins (64 per octave from 2^-24 to 2^24), because FP8's grid is logarithmic: a
linear histogram would put most activations of a tensor with a few outliers into its first bins.
One pass over the calibration set suffices.

Definitions (FP8 E4M3, scale = amax / 448):
- `max`: the largest |x| seen.
- `percentile` (param `percentile`, default 99.99): the |x| below which that share of values lies.
- `mse`: the clip c among `num_candidates` log-spaced values in [`min_ratio` * max, max] (max
  included) that minimises the
  mean squared error between |x| and its FP8 quantize-dequantize with scale c/448 (values above c
  saturate to c), over the histogram's bin centres weighted by counts. FP8's rounding error is
  relative, so unlike INT8 the search rarely clips: an outlier's clip costs its whole excess,
  while the bulk keeps its relative precision under any scale (until it underflows into
  subnormals). On heavy-tailed samples it returns max or a value near it.
- `entropy`: the same search, minimising KL(P || Q), the INT8 entropy method carried to FP8's
  grid. P is the histogram of |x| with the mass above c moved into c's bin (what saturation does).
  Q spreads each FP8 code's share of P evenly over the bins of P that round to that code (only over
  bins where P is non-zero), so Q is what the quantizer can still tell apart. Bins that share a code
  cost information; saturation costs the clipped tail's shape. (An earlier definition compared P
  with the exact image of P under the quantizer, which put mass on far fewer bins than P fills
  and made the objective nearly flat in c.) It is weakly conditioned on FP8's grid; see the class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from quantstudy.quant.formats.fp8 import E4M3_MAX, fake_quant
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Calibrator as CalibratorName

_LOG2_LO, _LOG2_HI, _PER_OCTAVE = -24, 24, 64
BINS = (_LOG2_HI - _LOG2_LO) * _PER_OCTAVE


class Calibrator:
    """Base: tracks the max of |x|; subclasses with `uses_histogram` also keep a histogram."""

    uses_histogram = False

    def __init__(self) -> None:
        self.amax = 0.0
        self.hist: torch.Tensor | None = None  # float64 counts per log2 bin of |x|
        self.nonfinite = 0

    def collect(self, x: torch.Tensor) -> None:
        a = x.detach().float().abs().flatten()
        finite = torch.isfinite(a)
        if not bool(finite.all()):
            self.nonfinite += int((~finite).sum())
            a = a[finite]
        if a.numel() == 0:
            return
        self.amax = max(self.amax, float(a.max()))
        if self.uses_histogram:
            idx = ((torch.log2(a.clamp_min(2.0**_LOG2_LO)) - _LOG2_LO) * _PER_OCTAVE).long()
            # kept on the CPU, where the clip searches run over the bins
            counts = torch.bincount(idx.clamp(0, BINS - 1), minlength=BINS).double().cpu()
            self.hist = counts if self.hist is None else self.hist + counts

    def compute_amax(self) -> float:
        return self.amax

    @staticmethod
    def _edges() -> torch.Tensor:
        return 2.0 ** (_LOG2_LO + torch.arange(BINS + 1, dtype=torch.float64) / _PER_OCTAVE)

    def _centres(self) -> torch.Tensor:
        """Geometric bin centres, capped at the observed max."""
        e = self._edges()
        return torch.sqrt(e[:-1] * e[1:]).clamp(max=self.amax)


CALIBRATORS: dict[str, Callable[..., Calibrator]] = {}
C = TypeVar("C", bound=Calibrator)


def register(name: CalibratorName) -> Callable[[type[C]], type[C]]:
    """Class decorator: make a calibrator available to recipes under `name`."""

    def deco(cls: type[C]) -> type[C]:
        CALIBRATORS[name] = cls
        return cls

    return deco


@register(CalibratorName.MAX)
class MaxCalibrator(Calibrator):
    """amax = max |x| over the calibration set (the default, as in the seed studies)."""


@register(CalibratorName.PERCENTILE)
class PercentileCalibrator(Calibrator):
    uses_histogram = True

    def __init__(self, percentile: float = 99.99) -> None:
        super().__init__()
        if not 0 < percentile <= 100:
            raise UserError(
                f"percentile calibrator: percentile must be in (0, 100], got {percentile}"
            )
        self.percentile = percentile

    def compute_amax(self) -> float:
        if self.hist is None or self.hist.sum() == 0:
            return self.amax
        cdf = torch.cumsum(self.hist, 0) / self.hist.sum()
        target = torch.tensor(self.percentile / 100, dtype=torch.float64)
        idx = int(torch.searchsorted(cdf, target))
        upper = float(self._edges()[min(idx, BINS - 1) + 1])
        return min(self.amax, upper)


class _SearchCalibrator(Calibrator):
    """Shared clip search over candidates; subclasses define the loss of one candidate."""

    uses_histogram = True

    def __init__(self, num_candidates: float = 128, min_ratio: float = 2.0**-8) -> None:
        super().__init__()
        self.num_candidates = int(num_candidates)
        self.min_ratio = float(min_ratio)

    def _loss(self, clip: float, centres: torch.Tensor, counts: torch.Tensor) -> float:
        raise NotImplementedError

    def compute_amax(self) -> float:
        if self.hist is None or self.amax == 0:
            return self.amax
        centres, counts = self._centres(), self.hist
        candidates = self.amax * torch.logspace(
            torch.log2(torch.tensor(self.min_ratio)),
            0,
            self.num_candidates,
            base=2,
            dtype=torch.float64,
        )
        losses = [(self._loss(float(c), centres, counts), float(c)) for c in candidates]
        return min(losses)[1]

    @staticmethod
    def _quantized(clip: float, centres: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(clip / E4M3_MAX, dtype=torch.float32)
        return fake_quant(centres.float(), scale).double()


@register(CalibratorName.MSE)
class MSECalibrator(_SearchCalibrator):
    def _loss(self, clip: float, centres: torch.Tensor, counts: torch.Tensor) -> float:
        err = (self._quantized(clip, centres) - centres) ** 2
        return float((err * counts).sum() / counts.sum())


@register(CalibratorName.ENTROPY)
class EntropyCalibrator(_SearchCalibrator):
    """Searches [max/16, max] by default, TensorRT's INT8 range: below it the clipped mass piled
    into one bin makes P and Q trivially close and the objective degenerates. On FP8's relative
    grid the objective is weakly conditioned: the chosen clip moves far with the sample
    (docs/fp8-options.md, "Activations"). Prefer max, percentile or mse for FP8."""

    def __init__(self, num_candidates: float = 128, min_ratio: float = 1 / 16) -> None:
        super().__init__(num_candidates, min_ratio)

    def _loss(self, clip: float, centres: torch.Tensor, counts: torch.Tensor) -> float:
        p = counts.clone()
        over = centres > clip
        clip_bin = int(torch.searchsorted(self._edges(), torch.tensor(clip, dtype=torch.float64)))
        clip_bin = min(max(clip_bin - 1, 0), BINS - 1)
        p[clip_bin] += p[over].sum()
        p[over] = 0
        codes = self._quantized(clip, centres.clamp(max=clip))
        _, group = torch.unique(codes, return_inverse=True)
        nonzero = (p > 0).double()
        mass = torch.zeros(int(group.max()) + 1, dtype=torch.float64).index_add_(0, group, p)
        filled = torch.zeros_like(mass).index_add_(0, group, nonzero)
        q = nonzero * (mass / filled.clamp_min(1))[group]
        p, q = p / p.sum(), q / q.sum()
        mask = p > 0
        return float((p[mask] * torch.log(p[mask] / q[mask])).sum())


def make_calibrator(name: str, params: dict[str, float]) -> Calibrator:
    """Build a registered calibrator; unknown names and parameters are user errors."""
    if name not in CALIBRATORS:
        raise UserError(f"unknown calibrator '{name}' (known: {', '.join(sorted(CALIBRATORS))})")
    try:
        return CALIBRATORS[name](**params)
    except TypeError as e:
        raise UserError(f"calibrator '{name}': bad parameters {params}: {e}") from None
