"""The policy's verdict: one gate per criterion, and the decision they add up to."""

from __future__ import annotations

from typing import Literal

from quantstudy.record.base import Section


class Gate(Section):
    name: str
    kind: Literal["speed", "quality"]
    threshold: str
    measured: str
    passed: bool
    skipped_reason: str | None = None


class Decision(Section):
    ship: bool
    policy: str  # policy file or "builtin:default"
    gates: list[Gate]
    failed: list[str]
    summary: str

    def __bool__(self) -> bool:
        return self.ship
