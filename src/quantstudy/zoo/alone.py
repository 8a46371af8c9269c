"""`--check-alone MODEL`: time a model again with no other study on the GPU, and say whether its
x agrees with the row the shared run (`--jobs N`) gave it.

Agreement at a batch: the two quartile intervals of x, [q1, q3] over the timing rounds,
overlap. The alone study runs into `<out>/alone/` through the same sweep machinery, one worker,
no lock; `alone-check.json` in --out lists each batch's two intervals and the verdict.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.sweep.events import Job
from quantstudy.sweep.local import LocalExecutor, local_slots
from quantstudy.sweep.run import run_jobs
from quantstudy.zoo.board import ZooRow, collect_row
from quantstudy.zoo.catalogue import ZooEntry

ALONE_DIR = "alone"
CHECK_FILE = "alone-check.json"


def compare(shared: ZooRow, alone: ZooRow) -> list[dict[str, object]]:
    """Per batch both rows timed: the two x intervals and whether they overlap."""
    found = []
    for b in shared.batches:
        a = alone.at(b.batch)
        if a is None:
            continue
        found.append(
            {
                "model": shared.model,
                "batch": b.batch,
                "shared": [b.x_q1, b.x, b.x_q3],
                "alone": [a.x_q1, a.x, a.x_q3],
                "agree": a.x_q1 <= b.x_q3 and b.x_q1 <= a.x_q3,
            }
        )
    return found


def check_alone(
    models: tuple[str, ...],
    listed: list[tuple[ZooEntry, Job]],
    out: Path,
    device: str,
    console: Console,
) -> bool:
    """Time `models` alone and compare (module docstring); True when every batch agrees."""
    by_name = {e.name: (e, j) for e, j in listed}
    unknown = [m for m in models if m not in by_name]
    if unknown:
        raise UserError(f"--check-alone {unknown[0]}: not in the zoo list; give a listed model")
    chosen = [by_name[m] for m in models]
    alone = out / ALONE_DIR
    alone.mkdir(parents=True, exist_ok=True)
    if run_jobs([j for _, j in chosen], alone, LocalExecutor(local_slots(device, 1)), console):
        return False
    checks = []
    for entry, job in chosen:
        shared = collect_row(entry, out / job.folder)
        found = compare(shared, collect_row(entry, alone / job.folder))
        if not found:
            found = [{"model": entry.name, "agree": False, "why": "not timed in both runs"}]
        checks += found
    for c in checks:
        console.print(
            f"alone check: {c['model']} batch {c.get('batch', '-')}: shared x "
            f"{c.get('shared', '-')}, alone x {c.get('alone', '-')}: "
            + ("agree" if c["agree"] else "DISAGREE")
        )
    write_json_atomic(out / CHECK_FILE, {"checks": checks})
    return all(bool(c["agree"]) for c in checks)
