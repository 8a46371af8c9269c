"""What executors report back: a job (grid point and its folder) started or finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from quantstudy.sweep.grid import GridPoint
from quantstudy.sweep.point import PointStatus


@dataclass(frozen=True)
class Job:
    """One grid point to run, and its folder's name inside the sweep's --out."""

    point: GridPoint
    folder: str


class SweepEvents(Protocol):
    """Called from executor threads; implementations must be thread-safe."""

    def started(self, job: Job, worker: str) -> None: ...

    def finished(self, job: Job, status: PointStatus) -> None: ...
