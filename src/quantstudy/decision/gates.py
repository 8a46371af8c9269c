"""Each gate of a policy evaluated on a study record: numbers and a status, no prose.

A gate passes when its whole interval lies on the good side of its threshold, fails when the
whole interval lies on the bad side, and is inconclusive otherwise. Gates:

- "speed at batch B": x = fp16 ms / FP8 ms per timing round; the interval is the rounds' first
  and third quartile, the threshold `speed.min_speedup`.
- "top-1 change": FP8 top-1 minus the baseline's, Tango's paired interval (`stats.py`), at
  least `-quality.top1.margin_points` points. Unlabelled data: skipped (a pass, stated) unless
  `require_labels`, then inconclusive.
- "top-1 agreement": share of images whose top-1 equals the baseline's, Wilson interval, at
  least `quality.agreement.min`.
- "KL mean": mean KL(baseline || FP8), the recorded bootstrap interval, at most
  `quality.kl_mean.max`.
- "no NaN/Inf": the count of non-finite logits of every scanned engine must be 0.

Missing evidence never passes: an absent section, CPU timings, random weights or a record that
predates the numbers a gate needs make that gate inconclusive, with `missing` saying why; so
does a value or interval that is not a finite number (`status_of`).
Size is never a gate: a smaller artifact alone never ships.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from quantstudy.decision import stats
from quantstudy.decision.schema import Policy
from quantstudy.record import BatchSpeed, EngineQuality, Gate, QualitySection, StudyRecord
from quantstudy.record.vocab import (
    Baseline,
    Direction,
    GateKind,
    GateMetric,
    GateStatus,
    Missing,
)

TOP1 = "top-1 change"
AGREEMENT = "top-1 agreement"
KL_MEAN = "KL mean"
FINITE = "no NaN/Inf"


def speed_gate_name(batch: int | None) -> str:
    return "speed" if batch is None else f"speed at batch {batch}"


def status_of(low: float, high: float, threshold: float, direction: Direction) -> GateStatus:
    """Where an interval lies against a threshold whose good side is `direction`. An interval
    with an end that is not a finite number (broken timings: an FP8 time that underflows makes
    x infinite) says nothing: inconclusive, never a pass."""
    if not all(math.isfinite(v) for v in (low, high, threshold)):
        return GateStatus.INCONCLUSIVE
    good_low, good_high = (low, high) if direction == Direction.AT_LEAST else (-high, -low)
    t = threshold if direction == Direction.AT_LEAST else -threshold
    if good_low >= t:
        return GateStatus.PASS
    if good_high < t:
        return GateStatus.FAIL
    return GateStatus.INCONCLUSIVE


def _unevaluated(gate: Gate, missing: Missing, reason: str) -> Gate:
    return gate.model_copy(
        update={"status": GateStatus.INCONCLUSIVE, "missing": missing, "skipped_reason": reason}
    )


# --- speed --------------------------------------------------------------------------------


def speed_gates(record: StudyRecord, policy: Policy) -> list[Gate]:
    sp = policy.speed
    speed = record.speed
    if sp.batches is not None:
        targets: list[int | None] = list(sp.batches)
    elif speed is not None and speed.batches:
        targets = [b.batch for b in speed.batches]
    else:
        targets = list(record.config.batches) or [None]

    why: tuple[Missing, str] | None = None
    if speed is None:
        why = (Missing.NOT_MEASURED, "no speed section in the study")
    elif not speed.meaningful:
        reason = speed.meaningless_reason or "timings marked not meaningful"
        why = (Missing.NOT_ON_GPU, f"timed on {speed.device} ({reason})")
    elif sp.compile_mode is not None and speed.compile_mode != sp.compile_mode:
        why = (
            Missing.NOT_TIMED,
            f"timed at compile mode {speed.compile_mode}, not {sp.compile_mode}",
        )
    by_batch: dict[int, BatchSpeed] = {b.batch: b for b in speed.batches} if speed else {}
    gates = []
    for batch in targets:
        gate = Gate(
            name=speed_gate_name(batch),
            kind=GateKind.SPEED,
            metric=GateMetric.SPEEDUP,
            batch=batch,
            threshold=sp.min_speedup,
            direction=Direction.AT_LEAST,
            status=GateStatus.INCONCLUSIVE,
        )
        bs = by_batch.get(batch) if batch is not None else None
        if why is not None:
            gates.append(_unevaluated(gate, *why))
        elif bs is None:
            gates.append(_unevaluated(gate, Missing.NOT_TIMED, f"batch {batch} was not timed"))
        elif not all(math.isfinite(v) for v in (bs.ratio.median, bs.ratio.q1, bs.ratio.q3)):
            said = f"x {bs.ratio.median:g} [{bs.ratio.q1:g}, {bs.ratio.q3:g}]"
            reason = f"{said} is not a finite number: the timings of batch {batch} are broken"
            gates.append(_unevaluated(gate, Missing.NOT_MEANINGFUL, reason))
        else:
            r = bs.ratio
            gates.append(
                gate.model_copy(
                    update={
                        "value": r.median,
                        "low": r.q1,
                        "high": r.q3,
                        "status": status_of(r.q1, r.q3, sp.min_speedup, Direction.AT_LEAST),
                    }
                )
            )
    return gates


# --- quality ------------------------------------------------------------------------------


def _against(quality: QualitySection, engine: str, baseline: Baseline) -> EngineQuality | None:
    """The engine's quality scored against `baseline` (None when the record lacks it)."""
    if baseline == Baseline.FP16:
        eq = quality.against_fp16
        return eq if eq is not None and eq.engine == engine else None
    return next((e for e in quality.engines if e.engine == engine), None)


def _baseline_missing(baseline: Baseline, engine: str) -> tuple[Missing, str]:
    if baseline == Baseline.FP16:
        return (
            Missing.NOT_RECORDED,
            f"no {engine} scores against the fp16 engine; studies record them since schema 6",
        )
    return Missing.NOT_MEASURED, f"no quality of the {engine} engine against fp32"


def top1_gate(
    eq: EngineQuality | None, policy: Policy, why: tuple[Missing, str] | None = None
) -> Gate:
    """The top-1 change gate on one engine's paired counts against its baseline."""
    tp = policy.quality.top1
    gate = Gate(
        name=TOP1,
        kind=GateKind.QUALITY,
        metric=GateMetric.TOP1_CHANGE,
        baseline=tp.baseline,
        threshold=tp.threshold,
        direction=Direction.AT_LEAST,
        confidence=policy.confidence,
        status=GateStatus.INCONCLUSIVE,
    )
    if why is not None:
        return _unevaluated(gate, *why)
    if eq is None:
        return _unevaluated(gate, *_baseline_missing(tp.baseline, policy.engine))
    if not eq.labelled:
        reason = "held-out set is unlabelled"
        if tp.require_labels:
            return _unevaluated(gate, Missing.UNLABELLED, f"{reason}; the policy requires labels")
        return gate.model_copy(
            update={
                "status": GateStatus.PASS,
                "missing": Missing.UNLABELLED,
                "skipped_reason": f"{reason}; the policy does not require labels",
            }
        )
    if eq.gained is None or eq.lost is None:
        return _unevaluated(gate, Missing.NOT_RECORDED, "no paired top-1 counts in the record")
    gained, lost, n, c = eq.gained, eq.lost, eq.n_images, policy.confidence
    low, high = stats.paired_change_interval(gained, lost, n, c)
    return _judged(
        gate.model_copy(update={"value": (gained - lost) / n}),
        (low, high),
        (tp.threshold, Direction.AT_LEAST),
        lambda: stats.images_for_change(gained, lost, n, tp.threshold, c),
    )


def _agreement_gate(eq: EngineQuality, policy: Policy, gate: Gate) -> Gate:
    ap = policy.quality.agreement
    n, c = eq.n_images, policy.confidence
    agree = n - eq.differ_count
    low, high = stats.proportion_interval(agree, n, c)
    return _judged(
        gate.model_copy(update={"value": agree / n}),
        (low, high),
        (ap.min, Direction.AT_LEAST),
        lambda: stats.images_for_proportion(agree, n, ap.min, c),
    )


def _kl_gate(eq: EngineQuality, policy: Policy, gate: Gate) -> Gate:
    kp = policy.quality.kl_mean
    c = policy.confidence
    if math.isnan(eq.kl_mean):
        return _unevaluated(gate, Missing.NOT_MEASURED, "no image is finite in both engines")
    interval = next(
        (i for i in eq.kl_mean_intervals or [] if math.isclose(i.level, c, abs_tol=1e-9)), None
    )
    gate = gate.model_copy(update={"value": eq.kl_mean})
    if interval is None:
        levels = ", ".join(f"{i.level:g}" for i in eq.kl_mean_intervals or [])
        detail = f"recorded at {levels} only" if levels else "studies record them since schema 6"
        return _unevaluated(
            gate, Missing.NOT_RECORDED, f"no KL-mean interval at confidence {c:g}: {detail}"
        )
    low, high = interval.low, interval.high
    return _judged(
        gate,
        (low, high),
        (kp.max, Direction.AT_MOST),
        lambda: stats.images_for_mean(eq.kl_mean, low, high, eq.n_images, kp.max, c),
    )


def _judged(
    gate: Gate,
    interval: tuple[float, float],
    limit: tuple[float, Direction],
    images_for: Callable[[], int | None],
) -> Gate:
    """`gate` with its interval (low, high), its status against the threshold and its good side
    (`limit`, `status_of`) and, only where that is inconclusive, about how many images would
    settle it (`images_for`, computed then)."""
    low, high = interval
    status = status_of(low, high, *limit)
    needed = stats.about(images_for()) if status == GateStatus.INCONCLUSIVE else None
    update = {"low": low, "high": high, "status": status, "images_needed": needed}
    return gate.model_copy(update=update)


def finite_gate(quality: QualitySection | None, engine: str) -> Gate:
    gate = Gate(
        name=FINITE,
        kind=GateKind.QUALITY,
        metric=GateMetric.NONFINITE,
        threshold=0.0,
        direction=Direction.AT_MOST,
        status=GateStatus.INCONCLUSIVE,
    )
    if quality is None:
        return _unevaluated(gate, Missing.NOT_MEASURED, "no quality section in the study")
    scans = quality.nonfinite
    if not scans:
        return _unevaluated(gate, Missing.NOT_MEASURED, "no NaN/Inf scan")
    if engine not in {s.engine for s in scans}:
        return _unevaluated(gate, Missing.NOT_MEASURED, f"{engine} was not scanned")
    bad = sum(len(s.nonfinite_heldout) + len(s.nonfinite_stress) for s in scans)
    status = GateStatus.FAIL if bad else GateStatus.PASS
    return gate.model_copy(update={"value": float(bad), "status": status})


def quality_gates(record: StudyRecord, policy: Policy) -> list[Gate]:
    qp, engine, c = policy.quality, policy.engine, policy.confidence
    quality = record.quality
    agreement = Gate(
        name=AGREEMENT,
        kind=GateKind.QUALITY,
        metric=GateMetric.AGREEMENT,
        baseline=qp.agreement.baseline,
        threshold=qp.agreement.min,
        direction=Direction.AT_LEAST,
        confidence=c,
        status=GateStatus.INCONCLUSIVE,
    )
    kl = Gate(
        name=KL_MEAN,
        kind=GateKind.QUALITY,
        metric=GateMetric.KL_MEAN,
        baseline=qp.kl_mean.baseline,
        threshold=qp.kl_mean.max,
        direction=Direction.AT_MOST,
        confidence=c,
        status=GateStatus.INCONCLUSIVE,
    )
    finite = finite_gate(quality, engine)
    if quality is None:
        speed_only = not record.config.quality
        text = "speed-only study (--no-quality)" if speed_only else "no quality section"
        why = (Missing.NOT_MEASURED, f"{text} in the study")
        return [
            top1_gate(None, policy, why),
            *(_unevaluated(g, *why) for g in (agreement, kl)),
            _unevaluated(finite, *why) if speed_only else finite,
        ]
    if record.model.random_weights or not quality.meaningful:
        why = (
            (Missing.RANDOM_WEIGHTS, "random weights: not evidence for a deployable model")
            if record.model.random_weights
            else (
                Missing.NOT_MEANINGFUL,
                quality.meaningless_reason or "quality marked not meaningful by the study",
            )
        )
        return [
            top1_gate(None, policy, why),
            *(_unevaluated(g, *why) for g in (agreement, kl)),
            finite,
        ]
    top1 = top1_gate(_against(quality, engine, qp.top1.baseline), policy)
    eq = _against(quality, engine, qp.agreement.baseline)
    agreement = (
        _agreement_gate(eq, policy, agreement)
        if eq is not None
        else _unevaluated(agreement, *_baseline_missing(qp.agreement.baseline, engine))
    )
    eq = _against(quality, engine, qp.kl_mean.baseline)
    kl = (
        _kl_gate(eq, policy, kl)
        if eq is not None
        else _unevaluated(kl, *_baseline_missing(qp.kl_mean.baseline, engine))
    )
    return [top1, agreement, kl, finite]
