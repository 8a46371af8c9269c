"""A sequential study's decision gates, from its looks (`sequential.py`).

After a `--heldout auto` study the top-1 change, agreement and KL-mean gates of the decision come
from the last look's confidence sequences, not from the quality section's fixed-N intervals,
which would not hold at a sample size the data chose (`policy.decide` uses `decision_gates`).
The NaN/Inf gate stays `gates.finite_gate`'s, which also counts the stress inputs.
"""

from __future__ import annotations

import math

from quantstudy.decision.gates import AGREEMENT, KL_MEAN, TOP1, status_of
from quantstudy.decision.schema import Policy
from quantstudy.decision.sequential import gate_rule
from quantstudy.record import Gate, GateLook, SequentialSection
from quantstudy.record.vocab import Baseline, GateKind, GateMetric, GateStatus, Missing


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
