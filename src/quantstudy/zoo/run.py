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

import importlib.metadata
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from quantstudy.record.io import write_json_atomic, write_text_atomic
from quantstudy.sweep.events import Job
from quantstudy.sweep.point import is_finished
from quantstudy.sweep.run import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    STATUSES,
    grid_table,
    make_executor,
    resolve_device,
    run_jobs,
    sweep_console,
)
from quantstudy.zoo.board import (
    Leaderboard,
    Provenance,
    collect_row,
    recorded_environment,
)
from quantstudy.zoo.catalogue import Catalogue, ZooEntry, load_catalogue
from quantstudy.zoo.markdown import render_markdown
from quantstudy.zoo.points import ZooOptions, zoo_point
from quantstudy.zoo.render import render_csv, write_plot

Listed = list[tuple[ZooEntry, Job]]


def run_zoo(options: ZooOptions, console: Console | None = None) -> int:
    """Run the shard of `options` and write the leaderboard; returns the exit status."""
    console = console or sweep_console()
    catalogue = load_catalogue(options.models)
    device = resolve_device(options.device)
    listed: Listed = []
    for entry in catalogue.entries:
        point = zoo_point(entry, options, device)
        listed.append((entry, Job(point, point.folder_name)))
    out = options.out.resolve()  # studies run in their own folders
    out.mkdir(parents=True, exist_ok=True)
    mine = [job for _, job in options.shard.take(listed)]
    todo = [j for j in mine if not is_finished(out / j.folder)]
    console.print(grid_table(mine, out))
    console.print(
        f"zoo: {len(listed)} models in {catalogue.source}, shard {options.shard}: {len(mine)}, "
        f"{len(mine) - len(todo)} finished before, {len(todo)} to run on {device}; out: {out}"
    )
    if options.dry_run:
        return 0
    interrupted = False
    if options.run and todo:
        executor, _ = make_executor(
            options.executor, device, options.address, options.transfer, options.workers
        )
        interrupted = run_jobs(todo, out, executor, console)
    board = write_leaderboard(options, catalogue, listed, out, device)
    console.print("zoo: " + ", ".join(f"{n} {s}" for s, n in board.counts.items() if n))
    console.print(f"leaderboard: {out / 'zoo.md'}, {out / 'zoo.csv'}")
    if interrupted:
        return EXIT_INTERRUPTED
    shard = {j.folder for j in mine}
    unfinished = [r for r in board.rows if r.folder in shard and r.status != "complete"]
    return EXIT_FAILED if options.run and unfinished else 0


def write_leaderboard(
    options: ZooOptions, catalogue: Catalogue, listed: Listed, out: Path, device: str
) -> Leaderboard:
    """zoo.json, zoo.csv, zoo.png and zoo.md in `out`, over every model of the list."""
    rows = [collect_row(entry, job, out) for entry, job in listed]
    environments: list[dict[str, str | None]] = []
    for _, job in listed:
        env = recorded_environment(out / job.folder)
        if env is not None and env not in environments:
            environments.append(env)
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
        ),
        batches=list(options.batches),
        counts={s: sum(r.status == s for r in rows) for s in STATUSES},
        rows=rows,
    )
    board = board.model_copy(update={"plot": write_plot(board, out)})
    write_json_atomic(out / "zoo.json", board.model_dump(mode="json"))
    write_text_atomic(out / "zoo.csv", render_csv(board))
    write_text_atomic(out / "zoo.md", render_markdown(board))
    return board


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
    }
    try:
        found["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        found["triton"] = None
    return found
