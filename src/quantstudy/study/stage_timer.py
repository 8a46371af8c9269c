"""A stage timer for `run_study`: wall time per stage, written into study.json and printed.

Wall time (`time.perf_counter`) around each stage's code, not CPU or GPU time: what a person
waiting for the study, or a sweep planning its grid, needs. GPU work inside a stage is finished
by the stage's own synchronising calls (results copied to the host), so it is inside the stage.
Each stage also says how much of it was Triton tile tuning (the tuning log's rows it added) and
waiting for the GPU lock and holding it (`gpu/timing_lock.waited_s`, `held_s`), where there
was any.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from quantstudy.gpu.timing_lock import held_s, waited_s
from quantstudy.record import StageTime, TimingsSection
from quantstudy.record.timings import StageTuning, TileChoices
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
        t0, tuned, waited, held = time.perf_counter(), len(_tune_log()), waited_s(), held_s()
        chosen = len(_log("CHOICE_LOG"))
        yield
        seconds = round(time.perf_counter() - t0, 3)
        wait, hold = round(waited_s() - waited, 3), held_s() - held
        tuning = _tuning(_tune_log()[tuned:])
        stage = StageTime(
            stage=name, seconds=seconds, tuning=tuning, lock_wait_s=wait or None,
            lock_held_s=round(hold, 3) if hold > 0 else None,  # None: never taken in the stage
            choices=_choices(_log("CHOICE_LOG")[chosen:]),
        )  # fmt: skip
        self._stages.append(stage)
        if self._echo is not None:
            self._echo(f"stage {name}: {seconds:.2f} s{_spent(stage)}")

    def add(self, name: str, seconds: float) -> None:
        """Record a stage timed elsewhere (a pass's share of an interleaved loop)."""
        seconds = round(seconds, 3)
        self._stages.append(StageTime(stage=name, seconds=seconds))
        if self._echo is not None:
            self._echo(f"  {name}: {seconds:.2f} s")

    def section(self) -> TimingsSection:
        total = round(time.perf_counter() - self._start, 3)
        return TimingsSection(stages=list(self._stages), total_s=total)


def _tune_log() -> list[dict[str, Any]]:
    """This process's tile tuning log (`quant/kernels/tuning.py: TUNE_LOG`)."""
    return _log("TUNE_LOG")


def _log(name: str) -> list[dict[str, Any]]:
    """A log of `quant/kernels/tuning.py` (`TUNE_LOG`, `CHOICE_LOG`); empty while that module
    is not loaded, for then nothing was tuned (not importing it keeps Triton out of a CPU
    study)."""
    module = sys.modules.get("quantstudy.quant.kernels.tuning")
    return getattr(module, name) if module is not None else []


def _choices(rows: list[dict[str, Any]]) -> TileChoices | None:
    """Where the launches of `rows` (`CHOICE_LOG`'s) took their configs; None: none chose."""
    if not rows:
        return None
    from quantstudy.quant.kernels.tuning import choice_counts  # loaded: it wrote the rows

    return TileChoices(**choice_counts(rows))


def _tuning(rows: list[dict[str, Any]]) -> StageTuning | None:
    """The tuning log's `rows` added up over every kernel (the tuning's own `summary`)."""
    if not rows:
        return None
    from quantstudy.quant.kernels.tuning import summary  # loaded: it wrote the rows

    kernels = summary(rows).values()
    return StageTuning(
        launches=int(sum(k["launches"] for k in kernels)),
        configs=int(sum(k["configs"] for k in kernels)),
        compile_s=round(sum(k["compile_s"] for k in kernels), 3),
        timing_s=round(sum(k["tune_s"] for k in kernels), 3),
    )


def _spent(stage: StageTime) -> str:
    """What the stage's echo adds: its tuning, its wait for the GPU lock and its hold of it,
    where any."""
    said = []
    if stage.tuning is not None:
        t = stage.tuning
        said.append(
            f"tile tuning {t.launches} launches, {t.configs} configs: compile "
            f"{t.compile_s:.2f} s, timing {t.timing_s:.2f} s"
        )
    if stage.choices is not None:
        c = stage.choices
        said.append(f"tiles: {c.table} from the table, {c.store} stored, {c.tuned} tuned")
    if stage.lock_wait_s is not None:
        said.append(f"GPU lock wait {stage.lock_wait_s:.2f} s")
    if stage.lock_held_s is not None:
        said.append(f"GPU lock held {stage.lock_held_s:.2f} s")
    return f" ({'; '.join(said)})" if said else ""


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
