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
    stuck(now)     # an open gate lacks evidence more images cannot bring (e.g. labels)
    make_section(policy, round_size, upper_bound, looks, stop_reason)  # record.sequential
    gates_from_look(now, policy)   # the decision's quality gates from a look
    decision_gates(record.sequential, policy)   # what `decide` uses for a sequential study
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from quantstudy.decision.confseq import (
    BET_BLOCK,
    FAIL,
    METHOD,
    OPEN,
    PASS,
    SOURCE,
    TRUNCATION,
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
from quantstudy.record import Gate, GateLook, Look, SequentialSection
from quantstudy.record.vocab import (
    Baseline,
    Direction,
    GateKind,
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

    `top1`: each engine's top-1 class index ("fp32", "fp16", "fp8", ...); `labels`: the true
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
        return prev.model_copy(update={"images": n, "estimate": max(float(bad), prev.estimate)})
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
    """An open gate lacks evidence more images cannot bring (no labels, no engine output)."""
    return any(g.status == GateStatus.INCONCLUSIVE and g.missing is not None for g in look.gates)


def _baseline_of(name: str, policy: Policy) -> Baseline:
    q = policy.quality
    return {TOP1: q.top1.baseline, AGREEMENT: q.agreement.baseline, KL_MEAN: q.kl_mean.baseline}[
        name
    ]


def _unevaluated(gate: Gate, missing: Missing, reason: str) -> Gate:
    return gate.model_copy(update={"missing": missing, "skipped_reason": reason})


def _decision_gate(g: GateLook, policy: Policy, confidence: float) -> Gate:
    """One interval gate of the decision from its last look, under `policy`.

    The look's verdict stands when the policy's threshold is the look's. Under another
    threshold the last interval decides: a confidence sequence holds at every size at once, so
    its last interval may be held against any threshold. A look at another confidence or
    against another baseline is not evidence for this policy's gate."""
    threshold, direction, _ = gate_rule(g.name, policy)
    baseline = _baseline_of(g.name, policy)
    gate = Gate(
        name=g.name,
        kind=GateKind.QUALITY,
        metric=g.metric,
        status=GateStatus.INCONCLUSIVE,
        baseline=baseline,
        value=g.estimate,
        low=g.lower,
        high=g.upper,
        confidence=policy.confidence,
        threshold=threshold,
        direction=direction,
    )
    if not math.isclose(confidence, policy.confidence, abs_tol=1e-9):
        why = f"looks recorded at confidence {confidence:g}, not {policy.confidence:g}"
        return _unevaluated(gate, Missing.NOT_RECORDED, why)
    if g.baseline != baseline:
        why = f"looks recorded against {g.baseline}, not {baseline}"
        return _unevaluated(gate, Missing.NOT_RECORDED, why)
    if g.missing == Missing.UNLABELLED and g.name == TOP1:
        reason = "held-out set is unlabelled"
        if policy.quality.top1.require_labels:
            return _unevaluated(gate, g.missing, f"{reason}; the policy requires labels")
        skip = f"{reason}; the policy does not require labels"
        return gate.model_copy(
            update={"status": GateStatus.PASS, "missing": g.missing, "skipped_reason": skip}
        )
    if g.missing is not None or g.lower is None or g.upper is None:
        why = g.skipped_reason or "no interval at the last look"
        return _unevaluated(gate, g.missing or Missing.NOT_MEASURED, why)
    if threshold == g.threshold and direction == g.direction:
        status = g.status
    else:
        status = status_of(g.lower, g.upper, threshold, direction)
    if status == GateStatus.PASS and g.above_cap:
        return _unevaluated(gate, Missing.NOT_MEASURED, g.skipped_reason or "KL above the cap")
    return gate.model_copy(update={"status": status, "skipped_reason": g.skipped_reason})


def gates_from_look(look: Look, policy: Policy) -> list[Gate]:
    """The decision's interval gates (top-1 change, agreement, KL mean) from a look taken under
    `policy`; the NaN/Inf gate stays `gates.finite_gate`'s, which also counts stress inputs."""
    return [
        _decision_gate(g, policy, policy.confidence)
        for g in look.gates
        if g.metric != GateMetric.NONFINITE
    ]


def decision_gates(section: SequentialSection | None, policy: Policy) -> dict[str, Gate]:
    """The interval gates of a sequential study's decision, by name, from its last look (empty
    without looks). After a sequential study these replace the fixed-N gates, whose intervals
    would not hold at a sample size the data chose (`policy.decide`)."""
    if section is None or not section.looks:
        return {}
    last = section.looks[-1]
    return {
        g.name: _decision_gate(g, policy, section.confidence)
        for g in last.gates
        if g.metric != GateMetric.NONFINITE
    }


__all__ = [
    "BET_BLOCK",
    "KL_CAP",
    "METHOD",
    "SOURCE",
    "TRUNCATION",
    "PerImage",
    "Scale",
    "confidence_sequence",
    "decision_gates",
    "first_verdicts",
    "gate_rule",
    "gates_from_look",
    "look",
    "make_section",
    "settled",
    "stuck",
]
