"""Wall time per stage of one study run: where a study's minutes went."""

from __future__ import annotations

from quantstudy.record.base import Section


class StageTime(Section):
    """One stage, timed with a monotonic clock around the stage's code."""

    stage: str  # e.g. "load", "calibrate", "engine fp16: build", "engine fp16: run", "score"
    seconds: float


class TimingsSection(Section):
    """Stages of the run that wrote this record, in the order they ran.

    A resumed study times only its own run: stages restored from the stage cache take their
    (short) reload time.
    """

    stages: list[StageTime]
    total_s: float  # from the start of the run to the end of the last stage
