"""The quality gates looked at after every round of held-out images, with anytime-valid intervals.

A fixed-N interval (`stats.py`) is valid once, at a sample size chosen in advance. A study that
keeps taking images until its gates settle looks many times and stops when it likes what it
sees; fixed-N intervals would then claim more confidence than they have. A confidence sequence
is a sequence of intervals that holds at every sample size at once: with probability at least
1 - alpha the mean lies inside every one of them, so a look after every round, a stop at any
time, and a later `extend` with more images keep the stated level.

Method: the predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB) of
Waudby-Smith and Ramdas (`SOURCE`, Theorem 2), for the mean of observations in [0, 1]. With
predictable bets lambda_i in [0, 1) and predictable means m_i (both fixed before X_i is seen),
      C_n = sum(lambda_i X_i) / sum(lambda_i)
            +- (log(2 / alpha) + sum((X_i - m_i)^2 psi(lambda_i))) / sum(lambda_i),
      psi(l) = -log(1 - l) - l,
is a (1 - alpha) confidence sequence. It needs no distribution, only the bounds, and adapts to
the variance (paired top-1 changes are mostly 0, so their variance is far below the range's).
Bets follow the paper's plug-in rule lambda = min(sqrt(2 log(2/alpha) / (s^2 n log(1 + n))),
`TRUNCATION`), with s^2 the variance of the images before the bet (prior 1/4, as in the paper)
and n the images at the end of the bet. Bets and means are refreshed every `BET_BLOCK` images
(any predictable choice keeps the guarantee); that keeps the statistics per block (count, sum,
sum of squares), which is what lets `simulate.py` run 10,000 studies in seconds through the
same code. The interval reported at a look is the running intersection over every block end so
far and the look itself (valid: the sequence holds at all those sizes at once).

The gates, each mapped onto [0, 1] (thresholds and policy as in `gates.py`):
- top-1 change vs the policy's baseline (labels needed): d_i = engine correct - baseline correct
  in {-1, 0, 1}, X_i = (d_i + 1) / 2.
- top-1 agreement vs its baseline: X_i = 1 when the engine's top-1 equals the baseline's.
- KL mean vs its baseline: KL is unbounded above. X_i = min(KL_i, `KL_CAP`) / `KL_CAP`.
  A fail needs no assumption (capping only lowers the mean, so a capped mean above the limit
  means a true one above it). A pass assumes that no image's KL exceeds the cap: the look
  counts the images that did (`above_cap`), and while any has, the gate cannot pass.
- no NaN/Inf: not an interval but a count. It fails at the first non-finite output and
  passes while there is none (a pass so far, not an inference: a later image may fail it).

Verdicts. A gate passes when its interval lies wholly on the good side of the threshold and
fails when it lies wholly on the bad side (`gates.status_of`), at the first block end or look
where that happens; the verdict then stays (`settled_at`). A wrong verdict needs the sequence
to miss the mean on one side, so its chance per gate is at most alpha / 2 over every look
(alpha = 1 - the policy's confidence, split over the two sides). `tests/unit/
test_decision_sequential.py` checks that rate by simulation.

API (the round loop in `study/` calls it after every round):
    per = PerImage(top1={"fp32": ..., "fp16": ..., "fp8": ...}, labels=labels,
                   kl={("fp32", "fp8"): kl}, nonfinite={"fp8": 0, ...})
    now = look(per, policy, previous=last_look)   # a record.Look
    settled(now)   # every quality gate passed or failed: stop
    stuck(now)     # an open gate lacks evidence more images cannot bring (e.g. labels)
    gates_from_look(now, policy)   # the decision's quality gates from the last look
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from quantstudy.decision.gates import AGREEMENT, FINITE, KL_MEAN, TOP1, status_of
from quantstudy.decision.schema import Policy
from quantstudy.record import Gate, GateLook, Look
from quantstudy.record.vocab import (
    Direction,
    GateKind,
    GateMetric,
    GateStatus,
    Missing,
)

METHOD = "predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB)"
SOURCE = (
    "Waudby-Smith, I. and Ramdas, A., Estimating means of bounded random variables by "
    "betting, J. R. Stat. Soc. B 86(1):1-27 (2024), arXiv:2010.09686, Theorem 2"
)
BET_BLOCK = 100  # images per bet: a smaller block bets closer to the paper's per-image rule
TRUNCATION = 0.75  # the largest bet; the paper suggests 1/2 or 3/4 (3/4 narrows low-variance KL)
KL_CAP = 1.0  # nats: per-image KL above this blocks the KL gate's pass (module docstring)

_OPEN, _PASS, _FAIL = 0, 1, 2
_STATUS = {_OPEN: GateStatus.INCONCLUSIVE, _PASS: GateStatus.PASS, _FAIL: GateStatus.FAIL}


@dataclass(frozen=True)
class PerImage:
    """Per-image results over the held-out images seen so far, all in the same image order.

    `top1`: each engine's top-1 class index ("fp32", "fp16", "fp8", ...); `labels`: the true
    class index, None for unlabelled data; `kl`: KL(baseline || engine) per image, keyed
    (baseline, engine), NaN where either output was not finite; `nonfinite`: the count of
    images with a non-finite output, per engine.
    """

    top1: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    kl: Mapping[tuple[str, str], np.ndarray] = field(default_factory=dict)
    nonfinite: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {len(a) for a in self.top1.values()} | {len(a) for a in self.kl.values()}
        if self.labels is not None:
            sizes.add(len(self.labels))
        if len(sizes) > 1:
            raise ValueError(f"per-image arrays differ in length: {sorted(sizes)}")

    @property
    def images(self) -> int:
        arrays = [*self.top1.values(), *self.kl.values()]
        return len(arrays[0]) if arrays else 0


# --- the confidence sequence ----------------------------------------------------------------


def block_stats(x: np.ndarray, block: int = BET_BLOCK) -> tuple[np.ndarray, ...]:
    """Count, sum and sum of squares of `x` (values in [0, 1]) per block of `block` images;
    the last block holds the remainder."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    starts = np.arange(0, x.size, block)
    count = np.diff(np.append(starts, x.size)).astype(np.float64)
    return count, np.add.reduceat(x, starts), np.add.reduceat(x * x, starts)


def confidence_sequence(
    count: np.ndarray, total: np.ndarray, total_sq: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """PrPl-EB lower and upper bounds at every block end, running-intersected.

    Inputs are per-block statistics of observations in [0, 1] along the last axis (leading
    axes: independent studies, for the simulation). Bet and mean of block k come from blocks
    before k only, so they are predictable."""
    n_end = np.cumsum(count, axis=-1)
    n_before = n_end - count
    s_before = np.cumsum(total, axis=-1) - total
    q_before = np.cumsum(total_sq, axis=-1) - total_sq
    mean_prior = (0.5 + s_before) / (n_before + 1.0)  # the paper's predictable mean
    spread = np.maximum(q_before - s_before * s_before / np.maximum(n_before, 1.0), 0.0)
    var = (0.25 + spread) / (n_before + 1.0)
    log_term = math.log(2.0 / alpha)
    bet = np.minimum(np.sqrt(2.0 * log_term / (var * n_end * np.log1p(n_end))), TRUNCATION)
    dev = total_sq - 2.0 * mean_prior * total + count * mean_prior * mean_prior
    psi = -np.log1p(-bet) - bet
    weight = np.cumsum(bet * count, axis=-1)
    center = np.cumsum(bet * total, axis=-1) / weight
    margin = (log_term + np.cumsum(psi * np.maximum(dev, 0.0), axis=-1)) / weight
    lower = np.maximum.accumulate(np.clip(center - margin, 0.0, 1.0), axis=-1)
    upper = np.minimum.accumulate(np.clip(center + margin, 0.0, 1.0), axis=-1)
    return lower, upper


def first_verdicts(
    lower: np.ndarray, upper: np.ndarray, threshold: float, direction: Direction
) -> tuple[np.ndarray, np.ndarray]:
    """The first verdict along the last axis and the index where it came (size if never).

    Codes: 0 open, 1 pass, 2 fail; pass and fail follow `gates.status_of` (a pass on the
    threshold itself, a fail strictly beyond it)."""
    if direction == Direction.AT_LEAST:
        passing, failing = lower >= threshold, upper < threshold
    else:
        passing, failing = upper <= threshold, lower > threshold
    size = lower.shape[-1]
    at_pass = np.where(passing.any(axis=-1), passing.argmax(axis=-1), size)
    at_fail = np.where(failing.any(axis=-1), failing.argmax(axis=-1), size)
    code = np.where(at_pass <= at_fail, _PASS, _FAIL)
    at = np.minimum(at_pass, at_fail)
    return np.where(at < size, code, _OPEN), at


# --- the gates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """A gate's value as offset + scale * x, with x in [0, 1] the sequence's units."""

    offset: float
    scale: float

    def to_unit(self, v: float) -> float:
        return (v - self.offset) / self.scale

    def value(self, x: float) -> float:
        return self.offset + self.scale * x


def gate_rule(name: str, policy: Policy) -> tuple[float, Direction, Scale]:
    """Threshold and good side of an interval gate under `policy`, and its map onto [0, 1]."""
    q = policy.quality
    rules = {
        TOP1: (q.top1.threshold, Direction.AT_LEAST, Scale(-1.0, 2.0)),
        AGREEMENT: (q.agreement.min, Direction.AT_LEAST, Scale(0.0, 1.0)),
        KL_MEAN: (q.kl_mean.max, Direction.AT_MOST, Scale(0.0, KL_CAP)),
    }
    return rules[name]


def _blank(name: str, metric: GateMetric, policy: Policy, images: int) -> GateLook:
    threshold, direction, _ = gate_rule(name, policy)
    return GateLook(
        name=name,
        metric=metric,
        images=images,
        threshold=threshold,
        direction=direction,
        status=GateStatus.INCONCLUSIVE,
    )


def _interval_look(
    gate: GateLook, x: np.ndarray, scale: Scale, alpha: float, previous: GateLook | None
) -> GateLook:
    """The gate's interval and verdict from its observations `x` in [0, 1]."""
    if x.size == 0:
        return gate.model_copy(update={"images": 0})
    stats = block_stats(x)
    lower, upper = confidence_sequence(*stats, alpha)
    ends = np.cumsum(stats[0]).astype(int)
    t = scale.to_unit(gate.threshold)
    code, at = first_verdicts(lower, upper, t, gate.direction)
    low, high = scale.value(float(lower[-1])), scale.value(float(upper[-1]))
    status, settled_at = _STATUS[int(code)], (int(ends[at]) if code != _OPEN else None)
    if previous is not None and previous.lower is not None and previous.upper is not None:
        low, high = max(low, previous.lower), min(high, previous.upper)
        if previous.status != GateStatus.INCONCLUSIVE and previous.missing is None:
            status, settled_at = previous.status, previous.settled_at
        elif status == GateStatus.INCONCLUSIVE:
            status = status_of(low, high, gate.threshold, gate.direction)
            settled_at = int(x.size) if status != GateStatus.INCONCLUSIVE else None
    return gate.model_copy(
        update={
            "images": int(x.size),
            "estimate": scale.value(float(x.mean())),
            "lower": low,
            "upper": high,
            "status": status,
            "settled_at": settled_at,
        }
    )


def _missing(gate: GateLook, missing: Missing, reason: str) -> GateLook:
    return gate.model_copy(update={"missing": missing, "skipped_reason": reason})


def _top1_look(per: PerImage, policy: Policy, n: int, prev: GateLook | None) -> GateLook:
    tp = policy.quality.top1
    gate = _blank(TOP1, GateMetric.TOP1_CHANGE, policy, n)
    gate = gate.model_copy(update={"baseline": tp.baseline})
    if per.labels is None:
        reason = "held-out set is unlabelled"
        if tp.require_labels:
            return _missing(gate, Missing.UNLABELLED, f"{reason}; the policy requires labels")
        gate = gate.model_copy(update={"status": GateStatus.PASS})
        return _missing(gate, Missing.UNLABELLED, f"{reason}; the policy does not require labels")
    engine, base = per.top1.get(policy.engine), per.top1.get(tp.baseline.value)
    if engine is None or base is None:
        return _missing(gate, Missing.NOT_MEASURED, "no per-image top-1 of both engines")
    labels = per.labels[:n]
    d = (engine[:n] == labels).astype(np.float64) - (base[:n] == labels)
    scale = gate_rule(TOP1, policy)[2]
    return _interval_look(gate, scale.to_unit(d), scale, 1.0 - policy.confidence, prev)


def _agreement_look(per: PerImage, policy: Policy, n: int, prev: GateLook | None) -> GateLook:
    ap = policy.quality.agreement
    gate = _blank(AGREEMENT, GateMetric.AGREEMENT, policy, n)
    gate = gate.model_copy(update={"baseline": ap.baseline})
    engine, base = per.top1.get(policy.engine), per.top1.get(ap.baseline.value)
    if engine is None or base is None:
        return _missing(gate, Missing.NOT_MEASURED, "no per-image top-1 of both engines")
    x = (engine[:n] == base[:n]).astype(np.float64)
    return _interval_look(gate, x, gate_rule(AGREEMENT, policy)[2], 1.0 - policy.confidence, prev)


def _kl_look(per: PerImage, policy: Policy, n: int, prev: GateLook | None) -> GateLook:
    kp = policy.quality.kl_mean
    gate = _blank(KL_MEAN, GateMetric.KL_MEAN, policy, n)
    gate = gate.model_copy(update={"baseline": kp.baseline, "cap": KL_CAP})
    kl = per.kl.get((kp.baseline.value, policy.engine))
    if kl is None:
        return _missing(gate, Missing.NOT_MEASURED, "no per-image KL against the baseline")
    kl = np.asarray(kl[:n], dtype=np.float64)
    kl = kl[np.isfinite(kl)]
    above = int(np.count_nonzero(kl > KL_CAP))
    scale = gate_rule(KL_MEAN, policy)[2]
    x = scale.to_unit(np.clip(kl, 0.0, KL_CAP))
    out = _interval_look(gate, x, scale, 1.0 - policy.confidence, prev)
    out = out.model_copy(update={"above_cap": above})
    if above and out.status == GateStatus.PASS:
        reason = f"{above} images have KL above the {KL_CAP:g}-nat cap the pass assumes"
        out = out.model_copy(
            update={"status": GateStatus.INCONCLUSIVE, "settled_at": None, "skipped_reason": reason}
        )
    return out


def _finite_look(per: PerImage, n: int, prev: GateLook | None) -> GateLook:
    gate = GateLook(
        name=FINITE,
        metric=GateMetric.NONFINITE,
        images=n,
        threshold=0.0,
        direction=Direction.AT_MOST,
        status=GateStatus.INCONCLUSIVE,
    )
    bad = int(sum(per.nonfinite.values()))
    if prev is not None and prev.status == GateStatus.FAIL:
        return prev.model_copy(update={"images": n, "estimate": max(float(bad), prev.estimate)})
    status = GateStatus.FAIL if bad else GateStatus.PASS
    return gate.model_copy(
        update={"estimate": float(bad), "status": status, "settled_at": n if bad else None}
    )


def look(
    per_image: PerImage, policy: Policy, images: int | None = None, previous: Look | None = None
) -> Look:
    """Every quality gate on the first `images` held-out images (None: all of them).

    `previous`, the look before this one, carries verdicts and intervals forward, so a gate
    once settled stays settled whatever the round sizes (intersecting with an earlier look's
    interval keeps the level: the sequence holds at both sizes at once)."""
    n = per_image.images if images is None else images
    if not 0 <= n <= per_image.images:
        raise ValueError(f"look at {n} images of {per_image.images}")
    if previous is not None and previous.images > n:
        raise ValueError(f"previous look at {previous.images} images is after this one ({n})")
    prev = {g.name: g for g in previous.gates} if previous is not None else {}
    return Look(
        images=n,
        gates=[
            _top1_look(per_image, policy, n, prev.get(TOP1)),
            _agreement_look(per_image, policy, n, prev.get(AGREEMENT)),
            _kl_look(per_image, policy, n, prev.get(KL_MEAN)),
            _finite_look(per_image, n, prev.get(FINITE)),
        ],
    )


def settled(look: Look) -> bool:
    """Every quality gate passed or failed: more images would not change a verdict."""
    return look.settled


def stuck(look: Look) -> bool:
    """An open gate lacks evidence more images cannot bring (no labels, no engine output)."""
    return any(g.status == GateStatus.INCONCLUSIVE and g.missing is not None for g in look.gates)


def gates_from_look(look: Look, policy: Policy) -> list[Gate]:
    """The decision's quality gates from a look, in `decide`'s typed form.

    After a sequential study these replace the fixed-N quality gates: their intervals would
    not hold at a sample size the data chose."""
    gates = []
    for g in look.gates:
        interval = g.metric != GateMetric.NONFINITE
        gates.append(
            Gate(
                name=g.name,
                kind=GateKind.QUALITY,
                metric=g.metric,
                status=g.status,
                baseline=g.baseline,
                value=g.estimate,
                low=g.lower if interval else None,
                high=g.upper if interval else None,
                confidence=policy.confidence if interval else None,
                threshold=g.threshold,
                direction=g.direction,
                missing=g.missing,
                skipped_reason=g.skipped_reason,
            )
        )
    return gates


__all__ = [
    "BET_BLOCK",
    "KL_CAP",
    "METHOD",
    "SOURCE",
    "TRUNCATION",
    "PerImage",
    "Scale",
    "confidence_sequence",
    "first_verdicts",
    "gate_rule",
    "gates_from_look",
    "look",
    "settled",
    "stuck",
]
