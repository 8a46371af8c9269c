"""The quality gates looked at after every round of held-out images, with anytime-valid intervals.

A fixed-N interval (`stats.py`) is valid once, at a sample size chosen in advance. A study that
keeps taking images until its gates settle looks many times and stops when it likes what it
sees; fixed-N intervals would then claim more confidence than they have. A confidence sequence
is a sequence of intervals that holds at every sample size at once: with probability at least
1 - alpha the mean lies inside every one of them, so a look after every round, a stop at any
time, and a later `extend` with more images keep the stated level.

Method: the predictable plug-in empirical-Bernstein confidence sequence of Waudby-Smith and
Ramdas (`confseq.py`: formula, bets, source), for means of observations in [0, 1], at
alpha = 1 - the policy's confidence, refreshed every `BET_BLOCK` images. The interval at a look
is the running intersection over every block end so far, the look itself and the look before.

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
    stuck(now)     # every open gate lacks evidence more images cannot bring (e.g. labels)
    stop_reason(now, data_left, upper_bound)   # a StopReason, or None: take another round
    make_section(policy, round_size, upper_bound, looks, stop_reason)  # record.sequential

The decision's gates from the looks: `sequential_gates.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantstudy.decision.confseq import (
    BET_BLOCK,
    FAIL,
    METHOD,
    OPEN,
    PASS,
    SOURCE,
    block_stats,
    confidence_sequence,
    first_verdicts,
)
from quantstudy.decision.gates import (
    AGREEMENT,
    FINITE,
    KL_MEAN,
    TOP1,
    status_of,
)
from quantstudy.decision.schema import Policy
from quantstudy.record import GateLook, Look, SequentialSection
from quantstudy.record.vocab import (
    Direction,
    GateMetric,
    GateStatus,
    Missing,
    StopReason,
)

KL_CAP = 1.0  # nats: per-image KL above this blocks the KL gate's pass (module docstring)

_STATUS = {OPEN: GateStatus.INCONCLUSIVE, PASS: GateStatus.PASS, FAIL: GateStatus.FAIL}


@dataclass(frozen=True)
class PerImage:
    """Per-image results over the held-out images seen so far, all in the same image order.

    `top1`: each engine's top-1 class index ("fp32", "fp16", "fp8", ...), -1 where its output
    was not finite (such an image is neither correct nor in agreement, as in the quality
    section's figures: `np.where(valid, top1, -1)`); `labels`: the true
    class index, None for unlabelled data; `kl`: KL(baseline || engine) per image, keyed
    (baseline, engine), NaN where either output was not finite; `nonfinite`: per engine,
    either a boolean array (this image had a non-finite output) or the count of such images
    among all of them (then a look at fewer images than the arrays hold counts them all).
    """

    top1: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    kl: Mapping[tuple[str, str], np.ndarray] = field(default_factory=dict)
    nonfinite: Mapping[str, int | np.ndarray] = field(default_factory=dict)

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


# --- the gates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """A gate's value as offset + scale * x, with x in [0, 1] the sequence's units."""

    offset: float
    scale: float

    def to_unit(self, v: Any) -> Any:  # a float, or an array of them
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
    status, settled_at = _STATUS[int(code)], (int(ends[at]) if code != OPEN else None)
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


def _correct(top1: np.ndarray, labels: np.ndarray) -> np.ndarray:
    correct: np.ndarray = (top1 == labels) & (top1 >= 0)
    return correct


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
    d = _correct(engine[:n], labels).astype(np.float64) - _correct(base[:n], labels)
    scale = gate_rule(TOP1, policy)[2]
    return _interval_look(gate, scale.to_unit(d), scale, 1.0 - policy.confidence, prev)


def _agreement_look(per: PerImage, policy: Policy, n: int, prev: GateLook | None) -> GateLook:
    ap = policy.quality.agreement
    gate = _blank(AGREEMENT, GateMetric.AGREEMENT, policy, n)
    gate = gate.model_copy(update={"baseline": ap.baseline})
    engine, base = per.top1.get(policy.engine), per.top1.get(ap.baseline.value)
    if engine is None or base is None:
        return _missing(gate, Missing.NOT_MEASURED, "no per-image top-1 of both engines")
    x = ((engine[:n] == base[:n]) & (engine[:n] >= 0)).astype(np.float64)
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


def _nonfinite(per: PerImage, n: int) -> tuple[int, int | None]:
    """Images with a non-finite output among the first `n`, and the first such image's count
    (None when unknown: only counts were given)."""
    bad, first = 0, None
    for v in per.nonfinite.values():
        if isinstance(v, np.ndarray):
            hits = np.flatnonzero(v[:n])
            bad += int(hits.size)
            if hits.size:
                first = min(first or n, int(hits[0]) + 1)
        else:
            bad += int(v)
    return bad, first


def _finite_look(per: PerImage, n: int, prev: GateLook | None) -> GateLook:
    gate = GateLook(
        name=FINITE,
        metric=GateMetric.NONFINITE,
        images=n,
        threshold=0.0,
        direction=Direction.AT_MOST,
        status=GateStatus.INCONCLUSIVE,
    )
    bad, first = _nonfinite(per, n)
    if prev is not None and prev.status == GateStatus.FAIL:
        return prev.model_copy(
            update={"images": n, "estimate": max(float(bad), prev.estimate or 0.0)}
        )
    status = GateStatus.FAIL if bad else GateStatus.PASS
    settled_at = (first or n) if bad else None
    return gate.model_copy(
        update={"estimate": float(bad), "status": status, "settled_at": settled_at}
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


def make_section(
    policy: Policy,
    round_size: int,
    upper_bound: int | None,
    looks: list[Look] | None = None,
    stop_reason: StopReason | None = None,
) -> SequentialSection:
    """The record's section for looks taken by `look` under `policy` (method, source and
    constants filled in here, so the round loop only supplies its own numbers)."""
    return SequentialSection(
        method=METHOD,
        source=SOURCE,
        alpha=1.0 - policy.confidence,
        confidence=policy.confidence,
        round_size=round_size,
        upper_bound=upper_bound,
        bet_block=BET_BLOCK,
        kl_cap=KL_CAP,
        looks=list(looks or []),
        stop_reason=stop_reason,
    )


def settled(look: Look) -> bool:
    """Every quality gate passed or failed: more images would not change a verdict."""
    return look.settled


def stuck(look: Look) -> bool:
    """Some gate is open and every open gate lacks evidence more images cannot bring (no
    labels, no engine output): more rounds cannot settle anything. While another gate is still
    open on evidence it is not stuck, since that gate may yet fail."""
    open_gates = [g for g in look.gates if g.status == GateStatus.INCONCLUSIVE]
    return bool(open_gates) and all(g.missing is not None for g in open_gates)


def stop_reason(look: Look, data_left: bool, upper_bound: int | None) -> StopReason | None:
    """Why the round loop stops after `look`, or None to take another round.

    `data_left`: whether the held-out data holds images not yet looked at; `upper_bound`: the
    most images the study may take (None: no limit). Settled comes first: a study that settled
    on its last images is settled, not exhausted."""
    if look.settled:
        return StopReason.SETTLED
    if stuck(look):
        return StopReason.NO_EVIDENCE
    if upper_bound is not None and look.images >= upper_bound:
        return StopReason.UPPER_BOUND
    if not data_left:
        return StopReason.DATA_EXHAUSTED
    return None


__all__ = [
    "KL_CAP",
    "PerImage",
    "Scale",
    "gate_rule",
    "look",
    "make_section",
    "settled",
    "stop_reason",
    "stuck",
]
