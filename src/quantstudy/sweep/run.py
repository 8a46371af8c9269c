"""`run_sweep`: expand the grid, print it, run the unfinished points, write sweep.json/.md.

Exit status: 0 when every point completed, 1 when one or more failed (each recorded in its
folder), 130 when stopped by Ctrl-C or SIGTERM (finished points are kept; a rerun resumes).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from quantstudy.record.io import make_folder, write_json_atomic, write_text_atomic
from quantstudy.study.guard import holding
from quantstudy.sweep.estimate import estimate
from quantstudy.sweep.events import Executor, ExecutorKind, Job, Transfer
from quantstudy.sweep.grid import expand
from quantstudy.sweep.local import LocalExecutor, local_slots
from quantstudy.sweep.markdown import render_markdown, write_plots
from quantstudy.sweep.point import is_finished, read_status
from quantstudy.sweep.progress import SweepProgress
from quantstudy.sweep.ray_executor import RayExecutor
from quantstudy.sweep.spec import load_sweep
from quantstudy.sweep.summary import SweepSummary, best_per_model, collect_row

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
STATUSES = ("complete", "failed", "interrupted", "partial", "pending")


@dataclass(frozen=True)
class SweepOptions:
    sweep_file: Path
    out: Path
    executor: ExecutorKind = "local"
    address: str | None = None
    workers: int | None = None
    transfer: Transfer = "auto"
    dry_run: bool = False


def resolve_device(requested: str | None) -> str:
    if requested is not None:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _state(out: Path, job: Job) -> str:
    if is_finished(out / job.folder):
        return "finished: skipped"
    status = read_status(out / job.folder)
    if status is None:
        return "new"
    return {"failed": "failed before: rerun", "complete": "partial: resume"}.get(
        status.status, f"{status.status}: resume"
    )


def grid_table(jobs: list[Job], out: Path) -> Table:
    table = Table(title=f"grid: {len(jobs)} studies", title_justify="left")
    swept = list(dict.fromkeys(o for job in jobs for o in job.point.swept))
    columns = ("#", "model", "weights", "recipe", "calibrator", "seed", "kernel", *swept, "state")
    for col in columns:
        table.add_column(col)
    for i, job in enumerate(jobs, 1):
        p, c = job.point, job.point.config
        recipe = Path(p.recipe).name if "/" in p.recipe else p.recipe
        table.add_row(
            str(i),
            c.model,
            Path(c.weights).name if "/" in c.weights else c.weights,
            recipe,
            p.calibrator or "recipe's own",
            str(c.seed),
            str(c.fp8_kernel),
            *(str(getattr(c, o)) for o in swept),
            _state(out, job),
        )
    return table


def make_executor(
    kind: ExecutorKind,
    device: str,
    address: str | None = None,
    transfer: Transfer = "auto",
    workers: int | None = None,
    jobs: int = 1,
    lock_dir: Path | None = None,
) -> tuple[Executor, int]:
    """The executor of `kind` for `device`, and how many studies it runs at once (`jobs` per
    GPU on the local executor, timing behind a lock file in `lock_dir`: `sweep/local.py`)."""
    if kind == "ray":
        return RayExecutor(device, address, transfer, workers), workers or 1
    local = LocalExecutor(local_slots(device, workers, jobs, lock_dir))
    return local, len(local.slots)


def run_jobs(
    jobs: list[Job],
    out: Path,
    executor: Executor,
    console: Console,
    progress: Callable[[Console, int], SweepProgress] = SweepProgress,
) -> bool:
    """Run `jobs` into `out` on `executor` with a `progress` bar; True when stopped by Ctrl-C
    or SIGTERM (the running studies are stopped cleanly, finished ones kept)."""
    stop = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()  # signal() needs it
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        if jobs:
            with progress(console, len(jobs)) as events:
                executor.run(jobs, out, events, stop)
    except KeyboardInterrupt:
        console.print("[yellow]stopped: finished studies are kept; rerun to resume[/yellow]")
        return True
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return False


def sweep_console() -> Console:
    """Progress on stderr; not a terminal (a log file, CI): wide enough for the grid table."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def run_sweep(options: SweepOptions, console: Console | None = None) -> int:
    """Run the sweep of `options`; returns the exit status. The run holds `--out`'s lock
    while its studies run and its summary is written."""
    console = console or sweep_console()
    spec = load_sweep(options.sweep_file)
    device = resolve_device(spec.device)
    jobs = [Job(p, p.folder_name) for p in expand(spec, device)]
    out = options.out.resolve()  # studies run in other working directories
    todo = [j for j in jobs if not is_finished(out / j.folder)]
    executor, workers = make_executor(
        options.executor, device, options.address, options.transfer, options.workers
    )
    console.print(grid_table(jobs, out))
    console.print(
        f"{len(jobs)} studies in the grid, {len(jobs) - len(todo)} finished before, "
        f"{len(todo)} to run on {device}; out: {out}"
    )
    console.print(estimate([j.point for j in todo], out, min(workers, max(1, len(todo)))).line())
    if options.dry_run:  # nothing written: a dry run leaves no folder behind
        return 0
    make_folder(out)
    # two sweeps into one folder would run the same studies at once, each reading the other's
    # half-written folders: the second is refused in one line (`study/guard.py: holding`)
    with holding(out, "--out"):
        todo = [j for j in todo if not is_finished(out / j.folder)]  # another may have ended
        interrupted = run_jobs(todo, out, executor, console)
        summary = write_summary(options, jobs, device, executor.description or options.executor)
    console.print(_counts_line(summary))
    console.print(f"summary: {out / 'sweep.md'}")
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if summary.counts["failed"] or summary.counts["pending"] else 0


def write_summary(
    options: SweepOptions, jobs: list[Job], device: str, executor: str
) -> SweepSummary:
    """sweep.json, the Pareto plots and sweep.md in --out, from every point's folder."""
    out = options.out.resolve()
    rows = [collect_row(job, out) for job in jobs]
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    summary = SweepSummary(
        sweep_file=str(options.sweep_file),
        executor=executor,
        device=device,
        counts=counts,
        rows=rows,
        best=best_per_model(rows),
        plots={},
    )
    summary = summary.model_copy(update={"plots": write_plots(summary, out)})
    write_json_atomic(out / "sweep.json", summary.model_dump(mode="json"))
    write_text_atomic(out / "sweep.md", render_markdown(summary))
    return summary


def _counts_line(summary: SweepSummary) -> str:
    return "sweep: " + ", ".join(f"{n} {s}" for s, n in summary.counts.items() if n)


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the sweep like Ctrl-C: running studies are stopped cleanly."""
    raise KeyboardInterrupt
