"""`run_zoo`: run the unfinished models of a shard of the list, then write the leaderboard of the
whole list from what --out holds (zoo.json, zoo.csv, zoo.md, zoo.png).

The studies run as a sweep's grid points (`sweep/`): one subprocess per model into a folder
named from its config, so a rerun (or the next shard into the same --out) skips every finished
model and resumes a partial one; a failing model is recorded in its folder and the others go on;
every study shares the host's Inductor, Triton and FP8 tuning caches, keyed by shape.

Exit status: 0 when every model of the shard completed, 1 when one or more failed (each in its
folder and in the leaderboard), 130 when stopped (finished models are kept; rerun to resume).
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from quantstudy.env.machine import gpu_name, torch_version, triton_version
from quantstudy.env.switches import lab_switches, switches_said
from quantstudy.record.errors import UserError
from quantstudy.record.io import make_folder, write_json_atomic, write_text_atomic
from quantstudy.record.vocab import RowStatus, choices
from quantstudy.study.guard import holding
from quantstudy.study.sources import engine_sources_sha256
from quantstudy.sweep.events import Executor, Job
from quantstudy.sweep.local import default_jobs
from quantstudy.sweep.point import PointStatus, is_finished
from quantstudy.sweep.run import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    grid_table,
    make_executor,
    resolve_device,
    run_jobs,
    sweep_console,
)
from quantstudy.zoo.alone import check_alone
from quantstudy.zoo.answers import AnswerProgress, answered, chain, next_refused, refused
from quantstudy.zoo.board import (
    Leaderboard,
    Provenance,
    ZooRow,
    collect_row,
    is_answer,
)
from quantstudy.zoo.catalogue import Catalogue, ZooEntry, load_catalogue
from quantstudy.zoo.markdown import render_markdown
from quantstudy.zoo.order import longest_first
from quantstudy.zoo.points import ZooOptions, row_settings, zoo_point
from quantstudy.zoo.render import render_csv, write_plot
from quantstudy.zoo.row_files import Current, read_rows, stale_reasons, write_row
from quantstudy.zoo.sources import read_marker, write_marker
from quantstudy.zoo.throughput import Timed, earlier_runs, measured_throughput

Listed = list[tuple[ZooEntry, Job]]


def run_zoo(options: ZooOptions, console: Console | None = None) -> int:
    """Run the shard of `options` and write the leaderboard; returns the exit status. The run
    holds `--out`'s lock throughout (`study/guard.py: holding`): two zoo runs into one folder
    would run the same studies at once, each reading the other's half-written folders."""
    catalogue = load_catalogue(options.models)
    options.shard.take(catalogue.entries)  # a shard of no model is refused before --out is made
    device = resolve_device(options.device)
    if options.rows is not None and device == "cpu":
        raise UserError(
            f"--rows {options.rows} keeps the rows measured on a GPU, and an x timed on the CPU "
            "means nothing there: run on a GPU, or leave out --rows (the leaderboard goes to "
            "--out)"
        )
    out = options.out.resolve()  # studies run in their own folders
    make_folder(out)
    with holding(out, "--out"):
        return _run_zoo(options, console or sweep_console(), catalogue, device, out)


def _run_zoo(
    options: ZooOptions, console: Console, catalogue: Catalogue, device: str, out: Path
) -> int:
    listed: Listed = []
    for entry in catalogue.entries:
        point = zoo_point(entry, options, device)
        listed.append((entry, Job(point, point.folder_name)))
    current = current_state(device)
    kept = _fresh_rows(options, listed, current, console)
    mine = [job for e, job in options.shard.take(listed) if e.name not in kept]
    todo = [j for j in mine if not _done_here(out / j.folder, current.engine_sources)]
    todo = longest_first(todo, read_rows(options.rows) if options.rows is not None else {})
    console.print(grid_table(mine, out))
    console.print(
        f"zoo: {len(listed)} models in {catalogue.source}, shard {options.shard}: "
        f"{len(mine) + len(kept)}, {len(kept)} kept from {options.rows}, "
        f"{len(mine) - len(todo)} finished before, {len(todo)} to run on {device}; out: {out}"
    )
    if options.dry_run:
        return 0
    interrupted, timed = False, None
    if options.run:
        jobs = options.jobs or default_jobs(device)
        executor, _ = make_executor(
            options.executor, device, options.address, options.transfer, options.workers,
            jobs=jobs, lock_dir=out,
        )  # fmt: skip
        start = time.monotonic()
        writer = row_writer(options, listed, out, current, console)
        interrupted = _run_with_answers(mine, todo, out, executor, console, current, writer)
        timed = Timed(frozenset(j.folder for j in todo), time.monotonic() - start, jobs)
    board = write_leaderboard(options, catalogue, listed, out, device, kept, timed, current)
    throughput = board.provenance.throughput
    if todo and throughput is not None:
        console.print(f"zoo: {throughput.line()}")
    if options.rows is not None:
        for row in board.rows:
            if row.model not in kept and is_answer(row) and _fresh(row, current):
                write_row(options.rows, row)
    console.print("zoo: " + ", ".join(f"{n} {s}" for s, n in board.counts.items() if n))
    console.print(f"leaderboard: {out / 'zoo.md'}, {out / 'zoo.csv'}")
    if interrupted:
        return EXIT_INTERRUPTED
    shard = {j.point.config.model for j in mine}
    unfinished = [r for r in board.rows if r.model in shard and not is_answer(r)]
    agree = not options.check_alone or check_alone(
        options.check_alone, listed, out, device, console
    )
    return EXIT_FAILED if (options.run and unfinished) or not agree else 0


def current_state(device: str) -> Current:
    """The engine sources and environment this run would measure a row with."""
    import torch

    gpu = gpu_name(torch.device(device))
    env = {"gpu_name": gpu, "torch": torch_version(), "triton": triton_version()}
    env |= {"lab_switches": switches_said(lab_switches())}
    return Current(engine_sources_sha256(), env)


def _fresh_rows(
    options: ZooOptions, listed: Listed, current: Current, console: Console
) -> dict[str, ZooRow]:
    """The committed rows this run keeps (`zoo/row_files.py`), by model; each stale one is said."""
    if options.rows is None:
        return {}
    committed = read_rows(options.rows)
    kept = {}
    for entry, job in listed:
        row = committed.get(entry.name)
        if row is None:
            continue
        reasons = stale_reasons(row, row_settings(job.point), current)
        if reasons:
            console.print(f"zoo: {entry.name}: stale row, measured again ({'; '.join(reasons)})")
        else:
            kept[entry.name] = row
    return kept


def _done_here(folder: Path, sources: str) -> bool:
    """`folder` holds the model's answer under `sources`; a finished study of other sources is
    moved aside (`<folder>.stale`) so its study runs again from the start."""
    finished = is_finished(folder) or refused(folder)
    if finished and read_marker(folder) == sources:
        return True
    if finished:
        aside = folder.with_name(folder.name + ".stale")
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)
    return False


def _run_with_answers(
    mine: list[Job],
    todo: list[Job],
    out: Path,
    executor: Executor,
    console: Console,
    current: Current,
    writer: Callable[[Job], None] = lambda job: None,
) -> bool:
    """Run `todo`, then the fallback studies of the models of `mine` whose recipe selects no
    layer (`zoo/answers.py`), one round per fallback after the whole list (the executors take
    a fixed list of jobs: `zoo/answers.py` says why); True when stopped."""
    sources = current.engine_sources
    jobs = todo
    while True:
        for job in jobs:
            write_marker(out / job.folder, sources)
        if run_jobs(jobs, out, executor, console, functools.partial(_RowsAsTheyEnd, write=writer)):
            return True
        jobs = [f for j in mine if (f := next_refused(j, out)) is not None]
        jobs = [j for j in jobs if not _done_here(out / j.folder, sources)]
        if not jobs:
            return False


class _RowsAsTheyEnd(AnswerProgress):
    """The zoo's progress lines, and each study's end handed to `write` (`row_writer`)."""

    def __init__(self, console: Console, total: int, write: Callable[[Job], None]) -> None:
        super().__init__(console, total)
        self._write = write

    def finished(self, job: Job, status: PointStatus) -> None:
        super().finished(job, status)
        self._write(job)


def row_writer(
    options: ZooOptions, listed: Listed, out: Path, current: Current, console: Console
) -> Callable[[Job], None]:
    """What writes, as a study ends, its model's row to `--rows` when the row is an answer
    measured here and now: a run killed outright (a device call's limit) keeps every row it
    finished, where the rows written at the run's end would be lost with it. The end of the run
    writes them all again, the same rows."""
    rows = options.rows
    roots = {step.folder: (entry, job) for entry, job in listed for step in chain(job)}
    triton = triton_version()

    def write(done: Job) -> None:
        if rows is None or done.folder not in roots:
            return
        entry, root = roots[done.folder]
        row = _row(entry, root, out, triton)
        if is_answer(row) and _fresh(row, current):
            try:
                write_row(rows, row)
            except OSError as err:  # the run goes on; its end tries again
                console.print(f"[yellow]zoo: {entry.name}'s row not written yet: {err}[/yellow]")

    return write


def _fresh(row: ZooRow, current: Current) -> bool:
    """`row` was measured here and now, on a GPU: it may go into the committed rows."""
    m = row.measured
    on_gpu = m is not None and m.environment.get("gpu_name") is not None
    return on_gpu and m is not None and not stale_reasons(row, m.settings, current)


def _row(entry: ZooEntry, job: Job, out: Path, triton: str | None) -> ZooRow:
    """The model's row from the folders of its chain (its own study, then any fallbacks)."""
    rows = []
    for step in chain(job):
        folder = out / step.folder
        stamp = {"engine_sources": read_marker(folder), "settings": row_settings(job.point)}
        rows.append((step, collect_row(entry, folder, stamp | {"triton": triton})))
    return answered(out, rows)


def write_board(options: ZooOptions) -> int:
    """The leaderboard page at `options.page` from the rows in `options.rows` alone, nothing
    run (`quantstudy zoo --rows DIR --page FILE` without --data); its provenance is the rows'
    own, so the same rows give the same page."""
    assert options.rows is not None and options.page is not None  # commands.py checks
    committed = read_rows(options.rows, required=True)  # a typo must not blank the page
    catalogue = load_catalogue(options.models)
    rows = [committed.get(e.name) or ZooRow(model=e.name, family=e.family, folder="-")
            for e in catalogue.entries]  # fmt: skip
    stamps = [r.measured for r in rows if r.measured is not None]
    environments: list[dict[str, str | None]] = []
    for m in stamps:
        if m.environment not in environments:
            environments.append(m.environment)
    batches = sorted({b.batch for r in rows for b in r.batches}) or list(options.batches)
    board = Leaderboard(
        provenance=Provenance(
            command=list(options.command),
            created_utc=max((m.created_utc for m in stamps), default="-"),
            models_file=Path(catalogue.source).name,
            models_sha256=catalogue.sha256,
            shard=str(options.shard),
            weights=options.weights,
            device="cuda" if any(e.get("gpu_name") for e in environments) else "cpu",
            driver={},
            environments=environments,
            engine_sources=engine_sources_sha256(),
        ),
        batches=batches,
        counts={s: sum(r.status == s for r in rows) for s in choices(RowStatus)},
        rows=rows,
    )
    page = options.page
    page.parent.mkdir(parents=True, exist_ok=True)
    board = board.model_copy(update={"plot": write_plot(board, page.parent)})
    plot = page.with_suffix(".png")
    if board.plot is not None and plot.name != board.plot:
        (page.parent / board.plot).replace(plot)
        board = board.model_copy(update={"plot": plot.name})
    write_text_atomic(page, render_markdown(board))
    return 0


def write_leaderboard(
    options: ZooOptions,
    catalogue: Catalogue,
    listed: Listed,
    out: Path,
    device: str,
    kept: dict[str, ZooRow] | None = None,
    timed: Timed | None = None,
    current: Current | None = None,
) -> Leaderboard:
    """zoo.json, zoo.csv, zoo.png and zoo.md in `out` (and the page at `options.page`), over
    every model of the list: its `kept` row, else the row of its studies in `out`; with `timed`,
    the run's throughput: its answered rows over its studies' wall time; rows measured under
    other engine sources than `current`'s (default: this tree's) read stale."""
    kept = kept or {}
    triton = triton_version()
    rows = [kept.get(e.name) or _row(e, j, out, triton) for e, j in listed]
    throughput = None
    if timed is not None:
        ran = [r for (_, j), r in zip(listed, rows, strict=True) if j.folder in timed.folders]
        throughput = measured_throughput([r for r in ran if is_answer(r)], timed)
    environments: list[dict[str, str | None]] = []
    for row in rows:
        env = row.measured.environment if row.measured is not None else None
        if env is not None and env not in environments:
            environments.append(env)
    sources = current.engine_sources if current else engine_sources_sha256()
    board = Leaderboard(
        provenance=Provenance(
            command=list(options.command) or ["quantstudy", "zoo", *sys.argv[1:]],
            created_utc=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            models_file=catalogue.source,
            models_sha256=catalogue.sha256,
            shard=str(options.shard),
            weights=options.weights,
            device=device,
            driver=_driver(),
            environments=environments,
            throughput=throughput,
            earlier=earlier_runs(out / "zoo.json", sources),
            engine_sources=sources,
        ),
        batches=list(options.batches),
        counts={s: sum(r.status == s for r in rows) for s in choices(RowStatus)},
        rows=rows,
    )
    board = board.model_copy(update={"plot": write_plot(board, out)})
    write_json_atomic(out / "zoo.json", board.model_dump(mode="json"))
    write_text_atomic(out / "zoo.csv", render_csv(board))
    write_text_atomic(out / "zoo.md", render_markdown(board))
    if options.page is not None:
        write_page(board, out, options.page)
    return board


def write_page(board: Leaderboard, out: Path, page: Path) -> None:
    """The leaderboard page at `page`, its plot beside it (for docs/: `zoo board`)."""
    page.parent.mkdir(parents=True, exist_ok=True)
    plot = None
    if board.plot is not None:
        plot = page.with_suffix(".png").name
        shutil.copyfile(out / board.plot, page.parent / plot)
    write_text_atomic(page, render_markdown(board.model_copy(update={"plot": plot})))


def _driver() -> dict[str, str | None]:
    """The zoo command's own environment: the commit and versions the leaderboard was made with
    (the studies record theirs; on one host they are the same install)."""
    import torch

    from quantstudy.study.environment import collect_environment

    env = collect_environment(torch.device("cpu"))
    found: dict[str, str | None] = {
        "git_commit": env.git_commit,
        "quantstudy": env.quantstudy,
        "python": env.python,
        "torch": env.torch,
        "timm": env.timm,
        "triton": env.triton,
    }
    return found
