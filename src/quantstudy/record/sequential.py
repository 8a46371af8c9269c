"""The sequential decision's record: every look at the quality gates while held-out images stream.

A study run with `--heldout auto` evaluates its held-out images in rounds and looks at every
quality gate after each round with an anytime-valid interval (a confidence sequence,
`decision/sequential.py`), stopping when every quality gate is settled, the data runs out or
the upper bound is reached. Each `Look` keeps what the gates showed at that point, so the
report can draw the intervals narrowing against their thresholds and say after how many images
each gate settled. Looks are numbers only; `report/` words them.
"""

from __future__ import annotations

from pydantic import Field

from quantstudy.record.base import Section
from quantstudy.record.vocab import (
    Baseline,
    Direction,
    GateMetric,
    GateStatus,
    Missing,
    StopReason,
)


class GateLook(Section):
    """One quality gate at one look: its interval so far against its threshold.

    `status` is inconclusive while the interval still straddles the threshold ("open");
    once pass or fail it stays so at every later look (`settled_at` says since when).
    """

    name: str  # the gate's name, as in the decision (`decision/gates.py`)
    metric: GateMetric
    baseline: Baseline | None = None  # the engine the gate compares FP8 with
    images: int  # images this gate used (KL: those finite in both engines)
    estimate: float | None = None  # sample mean over those images (KL: of the capped values)
    lower: float | None = None  # the confidence sequence's running lower bound
    upper: float | None = None  # and upper bound, at the section's confidence
    threshold: float
    direction: Direction  # the good side of `threshold`
    status: GateStatus
    settled_at: int | None = None  # images at which the verdict was first reached
    missing: Missing | None = None  # why the gate cannot be evaluated (more images won't help)
    skipped_reason: str | None = None  # details of `missing`, or a policy-allowed skip
    cap: float | None = None  # KL: per-image values are capped at this many nats
    above_cap: int | None = None  # KL: images whose KL exceeded the cap (blocks a pass)


class Look(Section):
    """Every quality gate after one round of held-out images."""

    images: int  # held-out images seen so far
    gates: list[GateLook]

    @property
    def settled(self) -> bool:
        """Every quality gate passed or failed: more images would not change the decision."""
        return all(g.status != GateStatus.INCONCLUSIVE for g in self.gates)


class SequentialSection(Section):
    """How the held-out images were looked at, and every look, in order."""

    method: str  # name of the confidence sequence
    source: str  # its published source (paper, theorem)
    alpha: float  # 1 - confidence: the chance, per gate and over every look, of a wrong verdict
    confidence: float
    round_size: int  # held-out images per round (one look per round)
    upper_bound: int | None = None  # the most held-out images the study would take
    bet_block: int  # images per bet of the confidence sequence (its predictable update step)
    kl_cap: float  # per-image KL cap, nats (the KL gate's stated assumption)
    looks: list[Look] = Field(default_factory=list)
    stop_reason: StopReason | None = None  # None: the study stopped before a reason was known
