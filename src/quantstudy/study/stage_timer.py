"""A stage timer for `run_study`: wall time per stage, written into study.json and printed.

Wall time (`time.perf_counter`) around each stage's code, not CPU or GPU time: what a person
waiting for the study, or a sweep planning its grid, needs. GPU work inside a stage is finished
by the stage's own synchronising calls (results copied to the host), so it is inside the stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from quantstudy.record.timings import StageTime, TimingsSection
from quantstudy.study.cache import console


def _echo(line: str) -> None:
    console.print(f"[dim]{line}[/dim]")


class StageTimer:
    """Collects (stage, seconds) in the order stages run; `section()` gives the record.

    Each finished stage is also echoed as one line (stderr), so the log of a study that is
    stopped or killed still shows where its time went up to then."""

    def __init__(self, echo: Callable[[str], None] | None = _echo) -> None:
        self._start = time.perf_counter()
        self._stages: list[StageTime] = []
        self._echo = echo

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body as `name`; a stage that raises is not recorded (the run failed)."""
        t0 = time.perf_counter()
        yield
        seconds = round(time.perf_counter() - t0, 3)
        self._stages.append(StageTime(stage=name, seconds=seconds))
        if self._echo is not None:
            self._echo(f"stage {name}: {seconds:.2f} s")

    def add(self, name: str, seconds: float) -> None:
        """Record a stage timed elsewhere (a pass's share of an interleaved loop)."""
        seconds = round(seconds, 3)
        self._stages.append(StageTime(stage=name, seconds=seconds))
        if self._echo is not None:
            self._echo(f"  {name}: {seconds:.2f} s")

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
