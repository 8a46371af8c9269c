"""A stage timer for `run_study`: wall time per stage, written into study.json and printed.

Wall time (`time.perf_counter`) around each stage's code, not CPU or GPU time: what a person
waiting for the study, or a sweep planning its grid, needs. GPU work inside a stage is finished
by the stage's own synchronising calls (results copied to the host), so it is inside the stage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from quantstudy.record.timings import StageTime, TimingsSection


class StageTimer:
    """Collects (stage, seconds) in the order stages run; `section()` gives the record."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._stages: list[StageTime] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body as `name`; a stage that raises is not recorded (the run failed)."""
        t0 = time.perf_counter()
        yield
        self._stages.append(StageTime(stage=name, seconds=round(time.perf_counter() - t0, 3)))

    def section(self) -> TimingsSection:
        total = round(time.perf_counter() - self._start, 3)
        return TimingsSection(stages=list(self._stages), total_s=total)


def format_timings(timings: TimingsSection) -> str:
    """The stage table printed at the end of a run: seconds and share of the total."""
    width = max([len(s.stage) for s in timings.stages] + [len("(between stages)")])
    total = timings.total_s or 1.0
    lines = [f"{'stage':<{width}}  {'seconds':>8}  {'share':>6}"]
    for s in timings.stages:
        lines.append(f"{s.stage:<{width}}  {s.seconds:>8.2f}  {s.seconds / total:>6.1%}")
    other = timings.total_s - sum(s.seconds for s in timings.stages)
    lines.append(f"{'(between stages)':<{width}}  {other:>8.2f}  {other / total:>6.1%}")
    lines.append(f"{'total':<{width}}  {timings.total_s:>8.2f}")
    return "\n".join(lines)
