"""What a zoo run measured of its own speed: its answered rows over its wall time, and the
runs before it into the same folder (`Provenance.throughput`, `.earlier`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_text
from quantstudy.zoo.board import Leaderboard, Throughput, ZooRow, added


class Timed(NamedTuple):
    """What a run measured: the study folders it ran, their wall seconds, studies at a time."""

    folders: frozenset[str]
    wall_s: float
    jobs: int


def measured_throughput(rows: list[ZooRow], timed: Timed) -> Throughput:
    """The run's answered `rows` over its wall time; over those whose records say their tile
    tuning and GPU-lock waits (schema 19), their studies' seconds and, of those, these two;
    where every row says it (schema 22), the seconds their studies held the GPU lock, and
    (schema 23) where their launches took their tiles."""
    said = [r for r in rows if r.tune_s is not None and r.lock_wait_s is not None]

    def total(values: list[float | None]) -> float | None:
        return round(sum(v or 0.0 for v in values), 1) if said else None

    holds = [r.lock_held_s for r in rows]
    held = round(sum(h or 0.0 for h in holds), 1) if rows and None not in holds else None

    return Throughput(
        rows=len(rows),
        wall_s=round(timed.wall_s, 1),
        jobs=timed.jobs,
        study_s=total([r.study_s for r in said]),
        tune_s=total([r.tune_s for r in said]),
        lock_wait_s=total([r.lock_wait_s for r in said]),
        lock_held_s=held,
        tile_choices=added([r.tile_choices for r in rows]),
    )


def earlier_runs(board: Path, engine_sources: str) -> list[Throughput]:
    """The runs the folder's last leaderboard (`board`) counted, when it was made under
    `engine_sources`: a zoo resumed over several calls adds them up. An empty list from a
    missing or unreadable board, or from one of other engine sources (its rows are measured
    again)."""
    if not board.is_file():
        return []
    try:
        last = Leaderboard.model_validate_json(read_text(board, "record", "leaderboard"))
    except (UserError, ValueError):  # pydantic's ValidationError is a ValueError
        return []
    return last.provenance.runs if last.provenance.engine_sources == engine_sources else []
