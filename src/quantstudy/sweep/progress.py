"""The live display of a sweep: one bar over all points, done / failed / running, and ETA."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from quantstudy.sweep.events import Job
from quantstudy.sweep.point import PointStatus

_SHOWN = ("complete", "failed", "running")  # always in the state line, in this order


class SweepProgress:
    """`SweepEvents` that drive a rich progress bar and print one line per finished point."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.counts = {"complete": 0, "failed": 0, "interrupted": 0, "running": 0}
        self._lock = threading.Lock()
        self._progress = Progress(
            TextColumn("[bold]sweep[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("sweep", total=total, state=self._state())

    def _state(self) -> str:
        c = self.counts
        more = "".join(f" {k} {n}" for k, n in c.items() if k not in _SHOWN and n)
        return f"done {c['complete']} failed {c['failed']}{more} running {c['running']}"

    def __enter__(self) -> SweepProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def started(self, job: Job, worker: str) -> None:
        with self._lock:
            self.counts["running"] += 1
            self._progress.update(self._task, state=self._state())

    def finished(self, job: Job, status: PointStatus) -> None:
        with self._lock:
            self.counts["running"] -= 1
            kind, line = self.said(job, status)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            done = status.status in ("complete", "failed")
            self._progress.update(self._task, advance=1 if done else 0, state=self._state())
            self.console.print(line)

    def said(self, job: Job, status: PointStatus) -> tuple[str, str]:
        """The count a finished point goes under, and the line printed for it (a caller that
        knows more of an outcome, such as the zoo's refusals, overrides this)."""
        wall = f"{status.wall_s:.1f} s" if status.wall_s is not None else "-"
        if status.status == "complete":
            return "complete", f"[green]done[/green] {job.point.label} ({wall})"
        if status.status == "failed":
            return "failed", f"[red]FAILED[/red] {job.point.label} ({wall}): {status.error}"
        return status.status, f"[yellow]stopped[/yellow] {job.point.label} ({wall})"
