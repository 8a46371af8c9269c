"""The self-check of meaning: the record agrees with itself before a report is rendered from it.

`report/selfcheck.py` checks that every number in the Markdown comes from the record
(provenance); a record whose decision was edited would still pass it and publish a report that
contradicts itself. `check_meaning(record)` returns what does not hold (empty: all holds):

1. A complete study has its decision, and its quality section unless it was speed only
   (`StudyConfig.quality` off).
2. The outcome follows from the gates (`decision/policy.py: outcome_of`), and the lists of
   failed and inconclusive gates name exactly the gates with that status.
3. The decision follows from the policy: taken again from the record's measurements under the
   recorded policy, every gate has the same status and value (so a figure the decision table
   quotes, e.g. the agreement, equals the one the quality table shows). Checked where the
   policy can still be read and the gates are typed (schema 6 and later).
"""

from __future__ import annotations

import math
from pathlib import Path

from quantstudy.decision.policy import decide, load_policy, outcome_of
from quantstudy.record import Decision, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import GateStatus

BUILTIN_PREFIX = "builtin:"


def check_meaning(record: StudyRecord) -> list[str]:
    """What in `record` does not agree with the rest of it (see the module docstring)."""
    if record.status == "complete":
        wanted = ("quality", "decision") if record.config.quality else ("decision",)
        missing = [s for s in wanted if getattr(record, s) is None]
        if missing:
            return [f"the study is complete but has no {' and no '.join(missing)} section"]
    decision = record.decision
    if decision is None:
        return []
    problems = _gate_problems(decision)
    if not problems:
        problems = _policy_problems(record, decision)
    return problems


def _gate_problems(decision: Decision) -> list[str]:
    problems = []
    outcome = outcome_of(decision.gates)
    if decision.outcome != outcome:
        problems.append(f"the outcome is {decision.outcome} but its gates add up to {outcome}")
    for status, listed in ((GateStatus.FAIL, decision.failed), (GateStatus.INCONCLUSIVE, None)):
        names = [g.name for g in decision.gates if g.status == status]
        listed = decision.inconclusive if listed is None else listed
        if names != listed:
            problems.append(f"the {status} gates are {names} but the decision lists {listed}")
    return problems


def _policy_problems(record: StudyRecord, decision: Decision) -> list[str]:
    if any(g.metric is None for g in decision.gates):  # text gates of a record before schema 6
        return []
    named = decision.policy.removeprefix(BUILTIN_PREFIX)
    if named == decision.policy and not Path(named).is_absolute():
        return []  # a file named relative to a folder the record does not say: not read here
    try:
        policy, label = load_policy(named)
    except UserError:  # the policy file is gone: the gates are all there is to check
        return []
    again = decide(record, policy, label)
    if [g.name for g in again.gates] != [g.name for g in decision.gates]:
        return [f"the policy {label} has gates {[g.name for g in again.gates]}, not these"]
    problems = []
    for ours, theirs in zip(decision.gates, again.gates, strict=True):
        if ours.status != theirs.status:
            problems.append(
                f"gate {ours.name!r} says {ours.status} but the measurements give {theirs.status}"
            )
        elif not _same(ours.value, theirs.value):
            problems.append(
                f"gate {ours.name!r} quotes {ours.value} but the measurements give {theirs.value}"
            )
    return problems


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
