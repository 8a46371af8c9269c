"""PNG plots of a study record, drawn with matplotlib's Agg canvas and written atomically.

Five plots, each only when the record holds its data (`available_plots` says which; the
Markdown links exactly those):

- `latency.png`: fp16 and FP8 median latency per batch with q1-q3 error bars, and the per-round
  ratio x = fp16 / FP8 (median, q1-q3) against the x = 1 line.
- `kernel_time.png`: profiler time per kernel group, stacked, one bar per (engine, batch).
- `kl.png`: per-image KL(fp32 || engine) histogram per engine (`kl_histogram` over
  `kl_bin_edges`), log x.
- `sensitivity.png`: KL mean per layer with only that layer quantized, in rank order (the
  record's `sensitivity` section; drawn by `quantstudy.report.search_plots`).
- `sequential.png`: each quality gate's confidence sequence at every look against its threshold
  (the record's `sequential` section; drawn by `quantstudy.report.sequential_plot`).

No pyplot: figures are built on `matplotlib.figure.Figure` with an Agg canvas, so nothing
global (backend, rcParams, open figures) changes. `figures` returns them (a notebook shows
them; `quantstudy.load_study(...).figures()`), `write_plots` writes them as PNG. Output is
deterministic for a given record and matplotlib version (no date in the PNG metadata).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantstudy.record import EngineQuality, StudyRecord
from quantstudy.record.io import write_bytes_atomic
from quantstudy.record.vocab import Engine, KernelGroup, choices
from quantstudy.report.search_plots import SENSITIVITY_PNG, png, sensitivity_figure
from quantstudy.report.sequential_plot import SEQUENTIAL_PNG, drawable, sequential_figure

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn, not with the report
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LATENCY_PNG = "latency.png"
KERNELS_PNG = "kernel_time.png"
KL_PNG = "kl.png"
PLOT_FILES = (LATENCY_PNG, KERNELS_PNG, KL_PNG, SENSITIVITY_PNG, SEQUENTIAL_PNG)

_GROUP_ORDER = choices(KernelGroup)
_GROUP_COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#7f7f7f")
_DPI = 100


def _kl_drawable(e: EngineQuality) -> bool:
    return (
        len(e.kl_bin_edges) == len(e.kl_histogram) + 1
        and sum(e.kl_histogram) > 0
        and any(x > 0 for x in e.kl_bin_edges)
    )


def available_plots(record: StudyRecord) -> list[tuple[str, str]]:
    """(file name, description) of each plot whose data the record holds, in a fixed order."""
    out = []
    if record.speed is not None and record.speed.batches:
        out.append((LATENCY_PNG, "latency per batch, fp16 and FP8, with q1-q3"))
    if record.speed is not None and record.speed.kernels:
        out.append((KERNELS_PNG, "kernel time per group per engine"))
    if record.quality is not None and any(_kl_drawable(e) for e in record.quality.engines):
        out.append((KL_PNG, "per-image KL distribution per engine"))
    if record.sensitivity is not None and record.sensitivity.layers:
        out.append((SENSITIVITY_PNG, "KL mean per layer with only that layer quantized"))
    if drawable(record.sequential):
        out.append((SEQUENTIAL_PNG, "each quality gate's interval at every look"))
    return out


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _latency(record: StudyRecord) -> Figure:
    sp = record.speed
    assert sp is not None
    fig = _figure(9.0, 3.8)
    ax, axr = fig.subplots(1, 2)
    xs = list(range(len(sp.batches)))
    for offset, key, label, color in (
        (-0.08, "fp16_ms", Engine.FP16, "#1f77b4"),
        (0.08, "fp8_ms", "FP8", "#d62728"),
    ):
        med = [getattr(b, key).median for b in sp.batches]
        lo = [getattr(b, key).median - getattr(b, key).q1 for b in sp.batches]
        hi = [getattr(b, key).q3 - getattr(b, key).median for b in sp.batches]
        ax.errorbar(
            [x + offset for x in xs],
            med,
            yerr=[lo, hi],
            fmt="o",
            capsize=4,
            label=label,
            color=color,
        )
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(xs, [str(b.batch) for b in sp.batches])
    ax.set_xlabel("batch")
    ax.set_ylabel("ms per call (median, q1-q3)")
    ax.legend()
    ax.set_title("latency" + ("" if sp.meaningful else " (NOT meaningful: not on GPU)"))
    med = [b.ratio.median for b in sp.batches]
    lo = [b.ratio.median - b.ratio.q1 for b in sp.batches]
    hi = [b.ratio.q3 - b.ratio.median for b in sp.batches]
    axr.errorbar(xs, med, yerr=[lo, hi], fmt="o", capsize=4, color="#333333")
    axr.axhline(1.0, color="#999999", linestyle="--", linewidth=1)
    axr.set_xticks(xs, [str(b.batch) for b in sp.batches])
    axr.set_xlabel("batch")
    axr.set_ylabel("x = fp16 ms / FP8 ms (median, q1-q3)")
    axr.set_title(f"compile mode {sp.compile_mode}")
    fig.suptitle(f"{record.model.name} on {sp.device}", fontsize=10)
    fig.tight_layout()
    return fig


def _kernels(record: StudyRecord) -> Figure:
    sp = record.speed
    assert sp is not None
    batches = sorted({k.batch for k in sp.kernels})
    per_batch = [[k for k in sp.kernels if k.batch == b] for b in batches]
    fig = _figure(8.5, 0.9 + sum(0.5 * len(ks) + 0.5 for ks in per_batch))
    grid = fig.subplots(len(batches), 1, squeeze=False, height_ratios=[len(ks) for ks in per_batch])
    axes: list[Axes] = list(grid[:, 0])
    for ax, batch, ks in zip(axes, batches, per_batch, strict=True):
        ys = list(range(len(ks)))
        left = [0.0] * len(ks)
        for group, color in zip(_GROUP_ORDER, _GROUP_COLORS, strict=True):
            widths = [next((g.time_us for g in k.groups if g.group == group), 0.0) for k in ks]
            ax.barh(ys, widths, left=left, color=color, label=group)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_yticks(ys, [k.engine for k in ks])
        ax.invert_yaxis()
        ax.set_title(f"batch {batch}", fontsize=9, loc="left")
    axes[-1].set_xlabel("profiler time per call, us")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper right", ncols=len(_GROUP_ORDER))
    fig.suptitle("kernel time per group", fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _kl(record: StudyRecord) -> Figure:
    q = record.quality
    assert q is not None
    fig = _figure(7.0, 4.0)
    ax = fig.subplots()
    positive_edges = []
    for e in q.engines:
        if not _kl_drawable(e):
            continue
        ax.stairs(e.kl_histogram, e.kl_bin_edges, label=e.engine)
        positive_edges += [x for x in e.kl_bin_edges if x > 0]
    ax.set_xscale("log")
    ax.set_xlim(min(positive_edges), max(positive_edges))
    ax.set_xlabel(f"KL({q.reference} || engine) per image")
    ax.set_ylabel("images")
    ax.legend(fontsize=8)
    title = "per-image KL"
    if record.model.random_weights:
        title += " (random weights: not meaningful)"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _sensitivity(record: StudyRecord) -> Figure:
    assert record.sensitivity is not None
    return sensitivity_figure(record.sensitivity)


def _sequential(record: StudyRecord) -> Figure:
    assert record.sequential is not None
    return sequential_figure(record.sequential)


_DRAW = {
    LATENCY_PNG: _latency,
    KERNELS_PNG: _kernels,
    KL_PNG: _kl,
    SENSITIVITY_PNG: _sensitivity,
    SEQUENTIAL_PNG: _sequential,
}


def figures(record: StudyRecord) -> dict[str, Figure]:
    """Each available plot (`available_plots`) as a matplotlib figure, by its file name."""
    return {name: _DRAW[name](record) for name, _ in available_plots(record)}


def write_plots(record: StudyRecord, out_dir: Path) -> list[Path]:
    """Write each available plot as PNG into `out_dir` atomically; return the paths written."""
    out_dir = Path(out_dir)
    written = []
    for name, fig in figures(record).items():
        path = out_dir / name
        write_bytes_atomic(path, png(fig))
        written.append(path)
    return written
