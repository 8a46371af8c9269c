"""The sequential decision's plot: each interval gate's confidence sequence against its threshold.

One panel per interval gate (top-1 change, agreement, KL mean): the running interval at every
look as a band, the estimate as a line, the threshold as a dashed line, and the look at which
the gate settled marked. It shows why a study stopped where it did, or why a gate stayed open.
Drawn like the study's other plots (`report/plots.py`): a matplotlib `Figure` on an Agg canvas,
no pyplot, no global state, no date in the PNG metadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantstudy.record import GateLook, SequentialSection
from quantstudy.record.vocab import GateMetric, GateStatus

if TYPE_CHECKING:  # matplotlib is imported where the plot is drawn, not with the report
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SEQUENTIAL_PNG = "sequential.png"
_DPI = 100
_PANELS = (
    (GateMetric.TOP1_CHANGE, "top-1 change, points", 100.0),
    (GateMetric.AGREEMENT, "agreement, %", 100.0),
    (GateMetric.KL_MEAN, "KL mean, nats", 1.0),
)
_COLORS = {GateStatus.PASS: "#2ca02c", GateStatus.FAIL: "#d62728"}


def _series(
    section: SequentialSection, metric: GateMetric
) -> list[tuple[int, GateLook, float, float]]:
    """(images, the gate, its lower and upper bound) at each look where it has an interval."""
    out = []
    for look in section.looks:
        g = next((g for g in look.gates if g.metric == metric), None)
        if g is not None and g.lower is not None and g.upper is not None:
            out.append((look.images, g, g.lower, g.upper))
    return out


def drawable(section: SequentialSection | None) -> bool:
    """Whether any interval gate has an interval at some look."""
    return section is not None and any(_series(section, m) for m, _, _ in _PANELS)


def sequential_figure(section: SequentialSection) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = [(m, name, k) for m, name, k in _PANELS if _series(section, m)]
    fig = Figure(figsize=(4.0 * len(panels), 3.6), dpi=_DPI)
    FigureCanvasAgg(fig)
    axes: list[Axes] = list(fig.subplots(1, len(panels), squeeze=False)[0])
    for ax, (metric, name, k) in zip(axes, panels, strict=True):
        series = _series(section, metric)
        xs = [n for n, *_ in series]
        last = series[-1][1]
        ax.fill_between(
            xs,
            [k * lower for _, _, lower, _ in series],
            [k * upper for _, _, _, upper in series],
            step="post" if len(xs) > 1 else None,
            color="#1f77b4",
            alpha=0.25,
            label=f"{100 * section.confidence:g}% confidence sequence",
        )
        ax.plot(xs, [k * (g.estimate or 0.0) for _, g, _, _ in series], "o-", ms=3, color="#1f77b4")
        ax.axhline(k * last.threshold, color="#333333", linestyle="--", linewidth=1)
        if last.settled_at is not None and last.status in _COLORS:
            ax.axvline(last.settled_at, color=_COLORS[last.status], linewidth=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("held-out images")
        ax.set_title(f"{last.name}: {last.status.value}", fontsize=9)
        ax.set_ylabel(name)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center")
    fig.suptitle(
        "quality gates looked at after every round (threshold dashed, verdict solid)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
