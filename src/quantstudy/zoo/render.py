"""The leaderboard's files, rendered from `Leaderboard` (zoo.json) alone: `zoo.csv` in the shape
of timm's results CSVs (one row per model, plain columns), `zoo.md` and `zoo.png` (x at the
largest batch against GMACs, by family)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from quantstudy.zoo.board import Leaderboard, ZooBatch, ZooRow

PLOT_FILE = "zoo.png"
# Columns before and after the per-batch ones; docs/zoo.md says what each holds.
HEAD_COLUMNS = (
    "model",
    "family",
    "params_m",
    "gmacs_conv_linear",
    "img_size",
    "fp8_layers",
    "conv_linear_layers",
    "recipe",
    "weights",
)
BATCH_COLUMNS = (
    "fp16_ms",
    "fp8_ms",
    "x",
    "x_q1",
    "x_q3",
    "ideal_x",
    "ideal_fraction",
    "x_settled",  # false: [q1, q3] contains 1.0 (`report/claims.py`); not ranked
    "warnings",  # the study's speed warnings and the claim's marks, "; "-joined
)
TAIL_COLUMNS = (
    "speed_meaningful",
    "quality_measured",
    "decision",
    "agreement",
    "wall_s",
    "study_s",
    "build_s",
    "tune_s",
    "lock_wait_s",
    "lock_held_s",
    "status",
    "error",
    "answer",
    "folder",
)


def csv_columns(batches: list[int]) -> list[str]:
    per_batch = [f"{c}_b{b}" if "_q" not in c else _q(c, b) for b in batches for c in BATCH_COLUMNS]
    return [*HEAD_COLUMNS, *per_batch, *TAIL_COLUMNS]


def _q(column: str, batch: int) -> str:
    """`x_q1` at batch 128 -> `x_b128_q1`."""
    stem, _, quartile = column.rpartition("_")
    return f"{stem}_b{batch}_{quartile}"


def _cells(row: ZooRow, batches: list[int]) -> dict[str, object]:
    cells: dict[str, object] = {
        "model": row.model,
        "family": row.family,
        "params_m": _round(row.params_m, 3),
        "gmacs_conv_linear": _round(row.gmacs, 3),
        "img_size": row.img_size,
        "fp8_layers": row.fp8_layers,
        "conv_linear_layers": row.conv_linear_layers,
        "recipe": row.recipe,
        "weights": row.weights,
    }
    for b in batches:
        at = row.at(b)
        values = _batch_values(at) if at is not None else {}
        for c in BATCH_COLUMNS:
            name = f"{c}_b{b}" if "_q" not in c else _q(c, b)
            cells[name] = _round(values.get(c), 4)
    cells |= {
        "speed_meaningful": row.speed_meaningful,
        "quality_measured": row.quality_measured,
        "decision": row.decision,
        "agreement": _round(row.agreement, 5),
        "wall_s": _round(row.wall_s, 1),
        "study_s": _round(row.study_s, 1),
        "build_s": _round(row.build_s, 1),
        "tune_s": _round(row.tune_s, 1),
        "lock_wait_s": _round(row.lock_wait_s, 1),
        "lock_held_s": _round(row.lock_held_s, 1),
        "status": row.status,
        "error": row.error,
        "answer": row.answer,
        "folder": row.folder,
    }
    return cells


def _batch_values(at: ZooBatch) -> dict[str, object]:
    """One batch's cells: its figures (a NaN left empty), whether x is settled, its warnings."""
    claim = at.claim()
    values: dict[str, object] = {
        k: v for k, v in at.model_dump().items() if not (isinstance(v, float) and math.isnan(v))
    }
    values["x_settled"] = claim.settled if claim.measured else None
    if not claim.settled:
        values["ideal_fraction"] = None  # a fraction of the ideal only for a settled x
    return values | {"warnings": "; ".join(batch_warnings(at)) or None}


def batch_warnings(at: ZooBatch) -> list[str]:
    """The study's own speed warnings where the row kept them (leaderboard version 6), with
    the mark of ms medians that disagree with x; for an older row, what its figures show."""
    claim = at.claim()
    if at.warnings is None or not claim.measured:
        return claim.sentences()
    return [*at.warnings, *claim.disagreement()]


def _round(value: object, digits: int) -> object:
    return round(value, digits) if isinstance(value, float) else value


def render_csv(board: Leaderboard) -> str:
    """One row per model, in the leaderboard's order; empty cells where nothing was measured."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns(board.batches), lineterminator="\n")
    writer.writeheader()
    for row in board.rows:
        writer.writerow({k: "" if v is None else v for k, v in _cells(row, board.batches).items()})
    return buffer.getvalue()


def settled_x(row: ZooRow, batch: int) -> float | None:
    """The row's x at `batch` where its rounds support the sign of the gain; None otherwise
    (not timed, not a number, or [q1, q3] contains 1.0: `report/claims.py`)."""
    at = row.at(batch)
    return at.x if at is not None and at.claim().settled else None


def ranked(rows: list[ZooRow], batch: int) -> list[ZooRow]:
    """Rows with a settled x at `batch`, largest x first; then the timed rows whose x is not
    settled, then the others, each in list order: an unsettled x is not ranked."""
    settled = [r for r in rows if settled_x(r, batch) is not None]
    settled.sort(key=lambda r: -(settled_x(r, batch) or 0.0))
    unsettled = [r for r in rows if r.at(batch) is not None and settled_x(r, batch) is None]
    return settled + unsettled + [r for r in rows if r.at(batch) is None]


def unsettled(rows: list[ZooRow], batch: int) -> list[ZooRow]:
    """The timed rows whose x at `batch` is left out of every ranking and median."""
    return [r for r in rows if r.at(batch) is not None and settled_x(r, batch) is None]


def family_medians(rows: list[ZooRow], batch: int) -> list[tuple[str, float, int]]:
    """(family, median x at `batch`, models) over the rows whose x there is settled, largest
    median first; a family with no settled x is not in it."""
    by_family: dict[str, list[float]] = {}
    for r in rows:
        x = settled_x(r, batch)
        if x is not None:
            by_family.setdefault(r.family, []).append(x)
    medians = [(f, statistics.median(xs), len(xs)) for f, xs in by_family.items()]
    return sorted(medians, key=lambda m: -m[1])


def write_plot(board: Leaderboard, out: Path) -> str | None:
    """x at the largest batch against GMACs (log scale), one colour and marker per family, the
    q1-q3 interval as an error bar; None when no row has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = max(board.batches)
    rows = [r for r in board.rows if (at := r.at(batch)) is not None and at.claim().measured]
    rows = [r for r in rows if r.gmacs]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    colours = plt.get_cmap("tab20").colors
    markers = "os^vD<>Pp*hX"
    for i, family in enumerate(dict.fromkeys(r.family for r in rows)):
        style = {"fmt": markers[i % len(markers)], "color": colours[i % len(colours)]}
        for settled in (True, False):
            mine = [r for r in rows if r.family == family and _settled(r, batch) == settled]
            if mine:
                _points(ax, mine, batch, style, family, settled)
    ax.set_xscale("log")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("GMACs per image (conv and linear layers, at the model's input size)")
    ax.set_ylabel(
        f"x = fp16 ms / FP8 ms at batch {batch} (median, q1-q3)\nhollow: not settled, "
        "[q1, q3] contains 1.0"
    )
    cpu = " (CPU timings: not evidence for a GPU)" if not _meaningful(rows) else ""
    ax.set_title(f"FP8 against fp16 per timm model, {_gpu(board)}{cpu}", fontsize=10)
    ax.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out / PLOT_FILE, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return PLOT_FILE


def _settled(row: ZooRow, batch: int) -> bool:
    return settled_x(row, batch) is not None


def _points(
    ax: Any, rows: list[ZooRow], batch: int, style: dict[str, Any], family: str, settled: bool
) -> None:
    """One family's points with their q1-q3 bars; hollow where x is not settled."""
    xs = [b for r in rows if (b := r.at(batch)) is not None]
    face = {} if settled else {"markerfacecolor": "none"}
    ax.errorbar(
        [r.gmacs for r in rows],
        [b.x for b in xs],
        yerr=[[b.x - b.x_q1 for b in xs], [b.x_q3 - b.x for b in xs]],
        capsize=2,
        label=family if settled else f"{family} (not settled)",
        **style,
        **face,
    )


def _meaningful(rows: list[ZooRow]) -> bool:
    return all(r.speed_meaningful for r in rows if r.speed_meaningful is not None)


def _gpu(board: Leaderboard) -> str:
    gpus = sorted({e.get("gpu_name") or "CPU" for e in board.provenance.environments})
    return ", ".join(gpus) or board.provenance.device
