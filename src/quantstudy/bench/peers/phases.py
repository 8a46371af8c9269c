"""Where a peers row's seconds go: a clock around the row's parts (`schema.RowStep`); the short
table of them (`table.phase_table`) is printed after the row and rendered in the report.

Wall time (`time.perf_counter`) around each part's code. The GPU work of a part is inside it:
each ends on a synchronising call (a compile call's output copied back, the harness's rounds,
a quality pass's outputs on the host). The parts do not overlap: `fastest`'s per-layer kernel
choice runs inside its engine's build, so that build's part holds it; the harness's rounds and
kernel profiles of every batch are one part (the harness and the choice are engine code, whose
hash a zoo row and a peers row are measured under, `study/sources.py`, so they keep no clock of
ours). The seconds our kernels' autotuner spent inside a part come from its log
(`quant/kernels/tuning.py: TUNE_LOG`). Each part is printed as it ends,
so the log of a row stopped at its time limit (no record is written then) still says where its
minutes went.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from quantstudy.bench.peers.table import at_batch
from quantstudy.bench.schema import RowPhase, RowStep
from quantstudy.quant.kernels.tuning import TUNE_LOG


def _print(line: str) -> None:
    print(line, flush=True)


def _autotune_s(rows: list[dict[str, Any]]) -> float:
    return sum(float(r["compile_s"]) + float(r["tune_s"]) for r in rows)


class RowClock:
    """The parts of one row, in the order they ended (module docstring)."""

    def __init__(self, echo: Callable[[str], None] | None = _print) -> None:
        self.phases: list[RowPhase] = []
        self._echo = echo

    @contextmanager
    def phase(
        self,
        step: RowStep,
        engine: str | None = None,
        batch: int | None = None,
        detail: str | None = None,
    ) -> Iterator[None]:
        """Time the body as one part; a part that raises is not recorded (the row failed)."""
        start, tuned = time.perf_counter(), len(TUNE_LOG)
        yield
        seconds = round(time.perf_counter() - start, 3)
        autotune = round(_autotune_s(TUNE_LOG[tuned:]), 3)
        self._add(RowPhase(step=step, engine=engine, batch=batch, detail=detail, seconds=seconds,
                           autotune_s=autotune))  # fmt: skip

    def prepare(self, detail: str) -> AbstractContextManager[None]:
        """The study's preparation stage hook (`study/prepare.py: StageHook`)."""
        return self.phase(RowStep.PREPARE, detail=detail)

    def _add(self, phase: RowPhase) -> None:
        self.phases.append(phase)
        if self._echo is not None:
            words = (phase.step, phase.engine, phase.detail, at_batch(phase.batch))
            label = " ".join(w for w in words if w is not None)
            tuned = f" ({phase.autotune_s:.1f} s autotuning)" if phase.autotune_s >= 0.05 else ""
            self._echo(f"  {label}: {phase.seconds:.1f} s{tuned}")
