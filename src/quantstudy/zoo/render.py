"""The leaderboard's files, rendered from `Leaderboard` (zoo.json) alone: `zoo.csv` in the shape
of timm's results CSVs (one row per model, plain columns), `zoo.md` and `zoo.png` (x at the
largest batch against GMACs, by family)."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

from quantstudy.zoo.board import Leaderboard, ZooRow

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
        values = at.model_dump() if at is not None else {}
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


def ranked(rows: list[ZooRow], batch: int) -> list[ZooRow]:
    """Rows with x at `batch`, largest x first, then the others in list order."""
    timed = [r for r in rows if r.at(batch) is not None]
    timed.sort(key=lambda r: -r.at(batch).x)  # type: ignore[union-attr]
    return timed + [r for r in rows if r.at(batch) is None]


def family_medians(rows: list[ZooRow], batch: int) -> list[tuple[str, float, int]]:
    """(family, median x at `batch`, models) over the timed rows, largest median first."""
    by_family: dict[str, list[float]] = {}
    for r in rows:
        at = r.at(batch)
        if at is not None:
            by_family.setdefault(r.family, []).append(at.x)
    medians = [(f, statistics.median(xs), len(xs)) for f, xs in by_family.items()]
    return sorted(medians, key=lambda m: -m[1])


def write_plot(board: Leaderboard, out: Path) -> str | None:
    """x at the largest batch against GMACs (log scale), one colour and marker per family, the
    q1-q3 interval as an error bar; None when no row has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = max(board.batches)
    rows = [r for r in board.rows if r.at(batch) is not None and r.gmacs]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    colours = plt.get_cmap("tab20").colors
    markers = "os^vD<>Pp*hX"
    for i, family in enumerate(dict.fromkeys(r.family for r in rows)):
        mine = [r for r in rows if r.family == family]
        xs = [r.at(batch) for r in mine]
        ax.errorbar(
            [r.gmacs for r in mine],
            [b.x for b in xs if b is not None],
            yerr=[
                [b.x - b.x_q1 for b in xs if b is not None],
                [b.x_q3 - b.x for b in xs if b is not None],
            ],
            fmt=markers[i % len(markers)],
            color=colours[i % len(colours)],
            label=family,
            capsize=2,
        )
    ax.set_xscale("log")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("GMACs per image (conv and linear layers, at the model's input size)")
    ax.set_ylabel(f"x = fp16 ms / FP8 ms at batch {batch} (median, q1-q3)")
    cpu = " (CPU timings: not evidence for a GPU)" if not _meaningful(rows) else ""
    ax.set_title(f"FP8 against fp16 per timm model, {_gpu(board)}{cpu}", fontsize=10)
    ax.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out / PLOT_FILE, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return PLOT_FILE


def _meaningful(rows: list[ZooRow]) -> bool:
    return all(r.speed_meaningful for r in rows if r.speed_meaningful is not None)


def _gpu(board: Leaderboard) -> str:
    gpus = sorted({e.get("gpu_name") or "CPU" for e in board.provenance.environments})
    return ", ".join(gpus) or board.provenance.device
