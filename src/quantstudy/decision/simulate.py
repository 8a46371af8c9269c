"""Simulated sequential studies, no model: how often the sequence's verdict is wrong, and when
it stops.

A simulated study draws per-image values i.i.d. from a small discrete distribution in a gate's
units (top-1 change: d in {-1, 0, 1} as lost / same / gained; agreement: 0 or 1; KL: a few
values in nats), bet block by bet block, as block counts (conditional binomials: the counts of
each value in a block of `BET_BLOCK` images), then runs the very functions a study's looks run
(`confseq.confidence_sequence`, `first_verdicts`) on those block statistics. A study looks
after every round of `round_size` images (a multiple of the bet block) and stops at the first
look where its gate is settled, or at `max_images`.

A verdict is wrong when it contradicts the true mean: a fail when the truth is on the good side
of the threshold, a pass when it is on the bad side, and either verdict when the truth sits on
the threshold itself (then both sides' alpha / 2 add up to alpha). Monte Carlo error: the
binomial standard error of a rate over `studies` simulated studies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantstudy.decision.confseq import BET_BLOCK, confidence_sequence, first_verdicts
from quantstudy.decision.gates import AGREEMENT, KL_MEAN, TOP1
from quantstudy.decision.schema import Policy
from quantstudy.decision.sequential import gate_rule
from quantstudy.record.vocab import Direction

Intervals = Callable[[np.ndarray, np.ndarray, np.ndarray, float], tuple[np.ndarray, np.ndarray]]
_TIE = 1e-12  # a truth this close to the threshold counts as on it


@dataclass(frozen=True)
class Case:
    """One simulated truth for one gate: per-image `values` (gate units) with `probs`."""

    gate: str  # `gates.TOP1`, `gates.AGREEMENT` or `gates.KL_MEAN`
    label: str  # where the truth lies, in words ("at the threshold", ...)
    values: tuple[float, ...]
    probs: tuple[float, ...]

    @property
    def truth(self) -> float:
        return float(np.dot(self.values, self.probs))


@dataclass(frozen=True)
class SimResult:
    case: Case
    studies: int
    threshold: float
    passed: float  # share of studies that settled on pass
    failed: float
    open: float  # never settled by max_images
    wrong: float  # share whose settled verdict contradicts the truth
    wrong_bound: float  # the guarantee: alpha / 2, or alpha with the truth on the threshold
    mean_stop: float  # mean images at stop (max_images for a study that never settled)
    median_stop: float
    max_images: int
    round_size: int

    @property
    def wrong_se(self) -> float:
        """Monte Carlo standard error of `wrong` (binomial, at the observed rate or the bound,
        whichever is larger, so a rate of 0 still has an error)."""
        p = max(self.wrong, self.wrong_bound)
        return math.sqrt(p * (1.0 - p) / self.studies)


def _block_counts(
    probs: tuple[float, ...], shape: tuple[int, int], rng: np.random.Generator
) -> np.ndarray:
    """Counts of each value per block of `BET_BLOCK` images, by conditional binomials."""
    counts: np.ndarray = np.zeros((*shape, len(probs)), dtype=np.int64)
    left: np.ndarray = np.full(shape, BET_BLOCK, dtype=np.int64)
    rest = 1.0
    for j, p in enumerate(probs[:-1]):
        share = min(max(p / rest, 0.0), 1.0) if rest > 0 else 0.0
        counts[..., j] = rng.binomial(left, share)
        left -= counts[..., j]
        rest -= p
    counts[..., -1] = left
    return counts


def _wrong(code: np.ndarray, truth: float, threshold: float, direction: Direction) -> np.ndarray:
    """Which first verdicts (1 pass, 2 fail) contradict the truth."""
    if abs(truth - threshold) <= _TIE:
        tie: np.ndarray = code != 0
        return tie
    good = truth > threshold if direction == Direction.AT_LEAST else truth < threshold
    wrong: np.ndarray = code == (2 if good else 1)
    return wrong


def simulate(
    case: Case,
    policy: Policy,
    studies: int = 10_000,
    max_images: int = 50_000,
    round_size: int = 500,
    seed: int = 0,
    intervals: Intervals = confidence_sequence,
    chunk: int = 2_000,
) -> SimResult:
    """`studies` simulated sequential studies of one gate under `policy` (module docstring).

    `intervals` is the interval procedure under test (the confidence sequence by default; a
    test passes a naive one to show the simulation catches an invalid procedure)."""
    if round_size % BET_BLOCK or max_images % round_size:
        raise ValueError(f"round size must divide {max_images} and be a multiple of {BET_BLOCK}")
    if not math.isclose(sum(case.probs), 1.0, abs_tol=1e-9):
        raise ValueError(f"probabilities of {case.label} sum to {sum(case.probs)}")
    threshold, direction, scale = gate_rule(case.gate, policy)
    units = np.array([scale.to_unit(v) for v in case.values])
    t_unit = scale.to_unit(threshold)
    alpha = 1.0 - policy.confidence
    blocks = max_images // BET_BLOCK
    rng = np.random.default_rng(seed)
    codes, stops = [], []
    for start in range(0, studies, chunk):
        counts = _block_counts(case.probs, (min(chunk, studies - start), blocks), rng)
        total, total_sq = counts @ units, counts @ (units * units)
        count = np.full(total.shape, float(BET_BLOCK))
        lower, upper = intervals(count, total, total_sq, alpha)
        code, at = first_verdicts(lower, upper, t_unit, direction)
        settle: np.ndarray = (at + 1) * BET_BLOCK
        stop = np.where(code != 0, np.ceil(settle / round_size) * round_size, max_images)
        codes.append(code)
        stops.append(stop)
    code, stop = np.concatenate(codes), np.concatenate(stops)
    on_threshold = abs(case.truth - threshold) <= _TIE
    return SimResult(
        case=case,
        studies=studies,
        threshold=threshold,
        passed=float(np.mean(code == 1)),
        failed=float(np.mean(code == 2)),
        open=float(np.mean(code == 0)),
        wrong=float(np.mean(_wrong(code, case.truth, threshold, direction))),
        wrong_bound=alpha if on_threshold else alpha / 2.0,
        mean_stop=float(stop.mean()),
        median_stop=float(np.median(stop)),
        max_images=max_images,
        round_size=round_size,
    )


TOP1_DISCORDANT = 0.03  # simulated share of images whose correctness changes (gained + lost)
KL_TAIL = 0.005  # simulated share of images at the KL distribution's large value


def cases(policy: Policy) -> list[Case]:
    """Truths below, on and above each interval gate's threshold under `policy`.

    top-1 change: `TOP1_DISCORDANT` of images change correctness; the change is the threshold
    and the threshold -+ max(margin, 0.5 point). Agreement: the minimum and -+ min(1 point,
    half the distance to 1). KL: values 0.1, 2.5 and 20 times the limit m (a long tail, at
    `KL_TAIL` of images), mixed for means 0.5 m, m and 1.5 m."""
    q = policy.quality
    out = []
    t, delta = q.top1.threshold, max(q.top1.margin_points / 100.0, 0.005)
    for label, d in (("below", t - delta), ("at", t), ("above", t + delta)):
        gained, lost = (TOP1_DISCORDANT + d) / 2.0, (TOP1_DISCORDANT - d) / 2.0
        out.append(Case(TOP1, label, (-1.0, 0.0, 1.0), (lost, 1.0 - lost - gained, gained)))
    a, delta = q.agreement.min, min(0.01, (1.0 - q.agreement.min) / 2.0)
    for label, p in (("below", a - delta), ("at", a), ("above", a + delta)):
        out.append(Case(AGREEMENT, label, (0.0, 1.0), (1.0 - p, p)))
    m = q.kl_mean.max
    low, mid, high = 0.1 * m, 2.5 * m, 20.0 * m
    if high > gate_rule(KL_MEAN, policy)[2].scale:
        raise ValueError(f"KL limit {m} too large for the simulated tail ({high} nats > cap)")
    for label, f in (("below", 0.5), ("at", 1.0), ("above", 1.5)):
        x = (f * m - low - KL_TAIL * (high - low)) / (mid - low)
        out.append(Case(KL_MEAN, label, (low, mid, high), (1.0 - x - KL_TAIL, x, KL_TAIL)))
    return out
