"""One study's row, as the sweep (`summary.py`) and the zoo (`zoo/board.py`) list it.

`read_row` is the one way from a study's folder to a row: its point.json says how the process
went, its study.json (read through `record/load.py`, the one record reader) holds the figures.
A row type adds its own figures with a `measure` function of the record; nothing is measured
here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from quantstudy.record import StudyRecord
from quantstudy.record.base import Section
from quantstudy.record.errors import UserError
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import Engine, Outcome, RowStatus
from quantstudy.sweep.point import read_status


class StudyRow(Section):
    """What every row says of its study: where it is, how it went, the headline figures."""

    folder: str  # the study's folder inside --out
    model: str
    status: RowStatus = RowStatus.PENDING
    error: str | None = None
    weights: str | None = None
    recipe: str | None = None
    wall_s: float | None = None  # the study's process, start to end (imports included)
    study_s: float | None = None  # the study's own total from its stage timings
    speed_meaningful: bool | None = None  # False: CPU timings
    agreement: float | None = None  # FP8 top-1 agreement with fp32
    kl_mean: float | None = None  # mean KL(fp32 || FP8)
    decision: Outcome | None = None


Row = TypeVar("Row", bound=StudyRow)
Measure = Callable[[StudyRecord], dict[str, Any]]


def read_row(folder: Path, row_type: type[Row], base: dict[str, Any], measure: Measure) -> Row:
    """The `row_type` row of the study in `folder`, whatever stage it reached: `base` (what the
    caller knows without a record), the point's outcome, and `measure(record)` where a record
    reads."""
    status = read_status(folder)
    base = base | {"folder": folder.name}
    if status is not None:
        # rows are read once their run is over: "running" then was left by a run killed
        # outright, so the study is interrupted, to resume
        said = RowStatus.INTERRUPTED if status.status == "running" else RowStatus(status.status)
        base |= {"status": said, "error": status.error}
        base["wall_s"] = status.wall_s
    study = folder / RECORD_FILE
    if not study.is_file():
        return row_type(**base)
    try:
        record = load_record(study)
    except UserError as err:  # e.g. written by a newer version: the row says so
        return row_type(**(base | {"status": RowStatus.FAILED, "error": str(err)}))
    if record.status != "complete" and base.get("status") == RowStatus.COMPLETE:
        base["status"] = RowStatus.PARTIAL
    return row_type(**(base | common_figures(record) | measure(record)))


def common_figures(record: StudyRecord) -> dict[str, Any]:
    """The figures every row type takes from a record."""
    found: dict[str, Any] = {}
    if record.recipe is not None:
        found["recipe"] = record.recipe.name
    if record.timings is not None:
        found["study_s"] = record.timings.total_s
    if record.speed is not None:
        found["speed_meaningful"] = record.speed.meaningful
    return found


def fp8_quality(record: StudyRecord) -> dict[str, Any]:
    """The FP8 engine's quality figures and the decision's outcome, where the record has them."""
    found: dict[str, Any] = {}
    if record.quality is not None:
        fp8 = next((e for e in record.quality.engines if e.engine == Engine.FP8), None)
        if fp8 is not None:
            found |= {"agreement": fp8.agreement, "kl_mean": fp8.kl_mean}
    if record.decision is not None:
        found["decision"] = record.decision.outcome
    return found
