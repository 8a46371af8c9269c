"""The policy's verdict: one typed gate per criterion, and the decision they add up to.

A gate holds numbers and a status, never prose: its value, the interval around it at the
policy's confidence, the threshold and the side of it that is good. `decision/` fills these,
`report/` words them. Records before schema 6 stored each gate as text (`threshold`, `measured`,
`passed`) and the decision as `ship`; they are converted on load, keeping that text in
`threshold_text` / `measured` / `summary` so their reports still say what the study said.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from quantstudy.record.base import Section
from quantstudy.record.vocab import (
    Baseline,
    Direction,
    GateKind,
    GateMetric,
    GateStatus,
    Missing,
    Outcome,
)


class Gate(Section):
    name: str
    kind: GateKind
    status: GateStatus
    metric: GateMetric | None = None  # None: a gate converted from a record before schema 6
    batch: int | None = None  # speed gates
    baseline: Baseline | None = None  # quality gates that compare with an engine
    value: float | None = None  # point estimate
    low: float | None = None  # interval at `confidence` (speed: q1 and q3 of the rounds)
    high: float | None = None
    confidence: float | None = None
    threshold: float | None = None
    direction: Direction | None = None  # the good side of `threshold`
    images_needed: int | None = None  # inconclusive gates: labelled images that would settle it
    missing: Missing | None = None  # why the gate has no evaluation
    skipped_reason: str | None = None  # details of `missing`, or a policy-allowed skip
    # Records before schema 6: the gate as text.
    threshold_text: str | None = None
    measured: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_text_gate(cls, data: Any) -> Any:
        if isinstance(data, dict) and "passed" in data:
            data = dict(data)
            data["status"] = GateStatus.PASS if data.pop("passed") else GateStatus.FAIL
            data["threshold_text"] = data.pop("threshold", None)
        return data

    @property
    def passed(self) -> bool:
        return self.status == GateStatus.PASS


class Redecision(Section):
    """A decision taken again later, from the recorded measurements, by `quantstudy decide`.
    `previous_*` is the study's own decision (the one `run` took), kept across re-decisions."""

    previous_outcome: Outcome | None  # None: the record held no decision
    previous_policy: str | None
    tool_version: str  # quantstudy version that decided again
    schema_version: int  # schema of this decision; the record keeps the version it was run with


class Decision(Section):
    outcome: Outcome
    policy: str  # preset ("builtin:default") or policy file
    confidence: float | None = None  # level of every quality interval; None before schema 6
    gates: list[Gate]
    failed: list[str]
    inconclusive: list[str] = Field(default_factory=list)
    images_needed: int | None = None  # the most any inconclusive quality gate needs
    redecided: Redecision | None = None
    summary: str | None = None  # records before schema 6 only: the decision as text

    @model_validator(mode="before")
    @classmethod
    def _from_ship_flag(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ship" in data:
            data = dict(data)
            data["outcome"] = Outcome.SHIP if data.pop("ship") else Outcome.NOT_SHIP
        return data

    @property
    def ship(self) -> bool:
        return self.outcome == Outcome.SHIP

    def __bool__(self) -> bool:
        return self.ship
