"""Results: the sequential decision (`--heldout auto`), look by look.

Only for a record with a `sequential` section. It says which confidence sequence was used and
where it comes from, why the study stopped, which gate settled after how many images (and which
stayed open), every look as a table, and the plot of each gate's interval narrowing against its
threshold (`report/sequential_plot.py`). Every number is a field of the section.
"""

from __future__ import annotations

from collections.abc import Callable

from quantstudy.record import GateLook, Look, SequentialSection, StudyRecord
from quantstudy.record.vocab import GateMetric, GateStatus, StopReason
from quantstudy.report.format import (
    fmt_count,
    fmt_level,
    fmt_pct,
    fmt_points,
    fmt_sig,
    maybe_collapsed,
    opt,
)
from quantstudy.report.lookups import label
from quantstudy.report.sections.tables import TableSpec, columns
from quantstudy.report.sequential_plot import SEQUENTIAL_PNG

_VALUE: dict[GateMetric, Callable[[float], str]] = {
    GateMetric.TOP1_CHANGE: fmt_points,
    GateMetric.AGREEMENT: fmt_pct,
    GateMetric.KL_MEAN: fmt_sig,
    GateMetric.NONFINITE: fmt_count,
}
_VERDICT = {GateStatus.PASS: "pass", GateStatus.FAIL: "fail", GateStatus.INCONCLUSIVE: "open"}
_STOP = {
    StopReason.SETTLED: "every quality gate settled",
    StopReason.DATA_EXHAUSTED: "the held-out data ran out",
    StopReason.UPPER_BOUND: "the study's image limit was reached",
}


def _fmt(g: GateLook) -> Callable[[float], str]:
    return _VALUE.get(g.metric, fmt_sig)


def _interval(g: GateLook) -> str:
    if g.lower is None or g.upper is None:
        return opt(g.estimate, _fmt(g), "not evaluated")
    f = _fmt(g)
    return f"{opt(g.estimate, f)} [{f(g.lower)}, {f(g.upper)}]"


def _cell(look: Look, metric: GateMetric) -> str:
    g = next((g for g in look.gates if g.metric == metric), None)
    if g is None:
        return "not evaluated"
    return f"{_interval(g)} {_VERDICT[g.status]}"


def _look_row(look: Look) -> list[str]:
    return [
        fmt_count(look.images),
        *(_cell(look, m) for m in (GateMetric.TOP1_CHANGE, GateMetric.AGREEMENT)),
        *(_cell(look, m) for m in (GateMetric.KL_MEAN, GateMetric.NONFINITE)),
    ]


LOOKS_TABLE = TableSpec(
    "sequential looks",
    columns(
        "Images",
        "Top-1 change, points [interval]",
        "Agreement [interval]",
        "KL mean [interval]",
        "NaN/Inf",
    ),
    _look_row,
)


def _settled(g: GateLook) -> str:
    if g.metric == GateMetric.NONFINITE and g.status == GateStatus.PASS:
        return "none so far (a count)"
    return opt(g.settled_at, fmt_count, "not settled")


def _gate_row(g: GateLook) -> list[str]:
    why = g.skipped_reason or (g.missing.value if g.missing is not None else "")
    return [
        g.name,
        label(g.baseline.value) if g.baseline is not None else "every engine",
        _VERDICT[g.status],
        _settled(g),
        fmt_count(g.images),
        _interval(g),
        f"{'at least' if g.direction == 'at_least' else 'at most'} {_fmt(g)(g.threshold)}",
        why,
    ]


GATES_TABLE = TableSpec(
    "sequential gates",
    columns(
        "Gate",
        "Baseline",
        "Verdict",
        "Settled at (images)",
        "Images used",
        "Estimate [interval]",
        "Threshold",
        "Note",
    ),
    _gate_row,
)
TABLES = [GATES_TABLE, LOOKS_TABLE]


def _method(s: SequentialSection) -> list[str]:
    bound = f", at most {fmt_count(s.upper_bound)} images" if s.upper_bound is not None else ""
    return [
        f"Held-out images were taken in rounds of {fmt_count(s.round_size)}{bound}, and every "
        f"quality gate was looked at after each round with a {fmt_level(s.confidence)} "
        f"confidence sequence: the {s.method} ({s.source}). Unlike a fixed-size interval it "
        "holds at every look at once, so stopping when the gates settle keeps its level: the "
        f"chance of a wrong verdict is at most alpha = {fmt_sig(s.alpha)} per gate over all "
        "looks, split evenly between a wrong pass and a wrong fail. Per-image KL is capped at "
        f"{fmt_sig(s.kl_cap)} nats: a "
        "KL fail needs no assumption, a KL pass assumes no image exceeds the cap (the "
        "Images used and Note columns say when one did). The NaN/Inf gate is a count: it fails "
        "at the first non-finite output and passes while there is none.",
        "",
    ]


def render_sequential(r: StudyRecord, plots: set[str]) -> list[str]:
    s = r.sequential
    if s is None:
        return []
    lines = ["### Sequential decision", "", *_method(s)]
    if not s.looks:
        return [*lines, "No look was taken.", ""]
    last = s.looks[-1]
    reason = _STOP[s.stop_reason] if s.stop_reason is not None else "no stop reason recorded"
    lines += [
        f"The study stopped after {fmt_count(last.images)} held-out images and "
        f"{len(s.looks)} looks: {reason}. Each gate at the last look:",
        "",
        *GATES_TABLE.render(last.gates),
        "",
    ]
    lines += maybe_collapsed(
        f"Every look ({len(s.looks)})", LOOKS_TABLE.render(s.looks), len(s.looks)
    )
    if SEQUENTIAL_PNG in plots:
        lines += [
            f"![Each quality gate's interval at every look against its threshold]"
            f"({SEQUENTIAL_PNG})",
            "",
        ]
    return lines
