"""Intervals for the quality gates, and how many labelled images would settle a gate.

Intervals, each at the policy's confidence c (z = the standard normal quantile at (1 + c) / 2):

- top-1 change (paired): Tango's score interval for a difference of paired proportions, from
  the counts alone (gained g: baseline wrong, FP8 right; lost l: baseline right, FP8 wrong; n
  images). It is the set of differences D whose score statistic
      (g - l - n D) / sqrt(n (2 q(D) + D (1 - D)))
  lies within +-z, with q(D) the maximum-likelihood rate of "lost" under the difference D.
  Unlike a bootstrap it needs no per-image data, works at any level, and keeps a width when no
  image changed (then it is +-z^2 / (n + z^2)).
- agreement (binomial): Wilson's score interval (scipy).
- KL mean: the bootstrap interval the quality stage recorded at that level.

Images needed. A gate settles when its whole interval lies on one side of its threshold t. If
the true rates were the observed ones, the interval's half-width shrinks as sigma z / sqrt(n),
so the number of images at which it settles with probability `POWER` is the usual
    n = (z + z_power)^2 sigma^2 / (estimate - t)^2
with per-image variance sigma^2:
- top-1 change: (g + l) / n - D^2 (paired proportions: McNemar's setting, Connor 1987);
  with no changed image, the n at which Tango's +-z^2 / (n + z^2) clears the margin;
- agreement (binomial): Wilson's interval leans toward 1/2, so instead of this formula the
  n is solved at which Wilson's bound, at the estimate moved z_power binomial standard errors
  toward t, reaches t (with every image agreeing: n / (n + z^2) = t);
- KL mean: from the recorded interval's width, sigma = sqrt(n) (high - low) / (2 z), a normal
  approximation.
An estimate exactly on the threshold has no finite n. Figures are rounded up to two significant
figures (`about`). `tests/unit/test_decision_stats.py` checks
the top-1 and agreement figures against a simulation of the same intervals.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binomtest, norm

POWER = 0.8  # chance that the interval settles at the figure given


def z_of(confidence: float) -> float:
    """Two-sided standard normal quantile of a `confidence` interval."""
    return float(norm.ppf((1.0 + confidence) / 2.0))


def _tango_score(gained: int, lost: int, n: int, d: float) -> float:
    a = 2.0 * n
    b = -gained - lost + d * (2.0 * n - gained + lost)
    c = -lost * d * (1.0 - d)
    q = (math.sqrt(max(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    var = n * (2.0 * q + d * (1.0 - d))
    num = gained - lost - n * d
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def paired_change_interval(
    gained: int, lost: int, n: int, confidence: float
) -> tuple[float, float]:
    """Tango's score interval on the paired change (g - l) / n, as fractions."""
    if n <= 0 or gained < 0 or lost < 0 or gained + lost > n:
        raise ValueError(f"bad paired counts: gained {gained}, lost {lost} of {n}")
    z = z_of(confidence)
    d_hat = (gained - lost) / n
    eps = 1e-12

    def f(d: float, target: float) -> float:
        return _tango_score(gained, lost, n, d) - target

    low = -1.0 if d_hat <= -1.0 + eps else brentq(f, -1.0 + eps, d_hat, args=(z,), xtol=1e-12)
    high = 1.0 if d_hat >= 1.0 - eps else brentq(f, d_hat, 1.0 - eps, args=(-z,), xtol=1e-12)
    return float(low), float(high)


def proportion_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson's score interval on a binomial proportion."""
    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def _factor(confidence: float) -> float:
    return (z_of(confidence) + float(norm.ppf(POWER))) ** 2


def images_for_change(
    gained: int, lost: int, n: int, threshold: float, confidence: float
) -> int | None:
    """Labelled images at which the top-1 change interval clears `threshold` (module docstring)."""
    d = (gained - lost) / n
    if d == threshold:
        return None
    discordant = (gained + lost) / n
    if discordant == 0.0:
        if threshold >= 0.0:
            return None  # no change at all can never show a gain
        z2 = z_of(confidence) ** 2
        return math.ceil(z2 * (1.0 / -threshold - 1.0))
    var = discordant - d * d
    return math.ceil(_factor(confidence) * var / (d - threshold) ** 2)


def _wilson_bound(p: float, n: float, z: float, upper: bool) -> float:
    """Wilson's bound in closed form, for a real-valued n (scipy's agrees at integers)."""
    z2n = z * z / n
    center = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    return center + half if upper else center - half


def images_for_proportion(
    successes: int, n: int, threshold: float, confidence: float
) -> int | None:
    """Images at which the agreement interval clears `threshold` (module docstring).

    Wilson's interval leans toward 1/2, so rather than the symmetric (Wald) formula this solves
    for the n at which Wilson's bound, taken at the estimate moved z_power standard errors
    toward the threshold, reaches it."""
    p = successes / n
    if p == threshold:
        return None
    z, zp = z_of(confidence), float(norm.ppf(POWER))
    upper = p < threshold  # a fail settles on the upper bound

    def gap(m: float) -> float:
        shift = zp * math.sqrt(p * (1.0 - p) / m)
        p_q = min(max(p + shift if upper else p - shift, 0.0), 1.0)
        bound = _wilson_bound(p_q, m, z, upper)
        return threshold - bound if upper else bound - threshold

    if gap(1e9) <= 0.0:
        return None
    return math.ceil(float(brentq(gap, 1.0, 1e9, xtol=0.5)))


def images_for_mean(
    mean: float, low: float, high: float, n: int, threshold: float, confidence: float
) -> int | None:
    """Images at which a mean's interval clears `threshold`, from its recorded width."""
    if mean == threshold or high <= low:
        return None
    sigma = math.sqrt(n) * (high - low) / (2.0 * z_of(confidence))
    return math.ceil(_factor(confidence) * sigma**2 / (mean - threshold) ** 2)


def about(n: int | None) -> int | None:
    """An images-needed figure rounded up to two significant figures (it is an estimate)."""
    if n is None or n < 100:
        return n
    step: int = 10 ** (len(str(n)) - 2)
    return -(-n // step) * step


def resolvable_change(discordant_rate: float, n: int, confidence: float) -> float:
    """The smallest top-1 margin (a fraction) a gate on `n` images settles with `POWER`, when
    the true change is 0 and `discordant_rate` of images change correctness."""
    return float(np.sqrt(_factor(confidence) * discordant_rate / n))


def images_for_margin(discordant_rate: float, margin: float, confidence: float) -> int:
    """Images at which a true change of 0 settles a top-1 margin `margin` with `POWER`."""
    return math.ceil(_factor(confidence) * discordant_rate / margin**2)
