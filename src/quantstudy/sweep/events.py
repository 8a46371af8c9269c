"""What an executor runs (jobs: a grid point and its folder) and reports back (a job started or
finished)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from quantstudy.sweep.grid import GridPoint
from quantstudy.sweep.point import PointStatus

ExecutorKind = Literal["local", "ray"]
# How a Ray worker's study folder reaches --out (`ray_executor.py`)
Transfer = Literal["auto", "shared", "copy"]


@dataclass(frozen=True)
class Job:
    """One grid point to run, and its folder's name inside the sweep's --out."""

    point: GridPoint
    folder: str


class SweepEvents(Protocol):
    """Called from executor threads; implementations must be thread-safe."""

    def started(self, job: Job, worker: str) -> None: ...

    def finished(self, job: Job, status: PointStatus) -> None: ...


class Executor(Protocol):
    """Runs jobs into --out until done or stopped (`local.py`, `ray_executor.py`)."""

    description: str

    def run(self, jobs: list[Job], out: Path, events: SweepEvents, stop: threading.Event) -> None:
        """Run every job; on KeyboardInterrupt, stop the running studies cleanly and re-raise."""
        ...
