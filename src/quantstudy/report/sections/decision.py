"""The decision in words: its summary sentence, the gate table, and the CLI's closing lines.

Everything is worded from the gates' typed fields (metric, value, interval, threshold, status,
missing); nothing here reads a gate's text. Gates of records before schema 6 carry only text
(`threshold_text`, `measured`) and are shown as they were recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from quantstudy.record import Decision, Gate
from quantstudy.record.vocab import Direction, GateMetric, GateStatus, Missing, Outcome
from quantstudy.report.format import (
    code,
    fmt_count,
    fmt_fine,
    fmt_level,
    fmt_pct,
    fmt_plain,
    fmt_points,
    fmt_ratio,
    fmt_sig,
    table,
)

OUTCOME_WORDS = {
    Outcome.SHIP: "shipped",
    Outcome.NOT_SHIP: "not shipped",
    Outcome.INCONCLUSIVE: "inconclusive",
}

_FORMAT: dict[GateMetric, Callable[[float], str]] = {
    GateMetric.SPEEDUP: fmt_ratio,
    GateMetric.TOP1_CHANGE: fmt_points,
    GateMetric.AGREEMENT: fmt_pct,
    GateMetric.KL_MEAN: fmt_sig,
    GateMetric.NONFINITE: fmt_count,
}
_UNIT = {GateMetric.TOP1_CHANGE: " points"}
_WHAT = {
    GateMetric.SPEEDUP: "the speed-up x",
    GateMetric.TOP1_CHANGE: "the top-1 change",
    GateMetric.AGREEMENT: "top-1 agreement",
    GateMetric.KL_MEAN: "the KL mean",
    GateMetric.NONFINITE: "the count of NaN/Inf logits",
}
MISSING_WORDS = {
    Missing.NOT_ON_GPU: "not measured on a GPU",
    Missing.NOT_TIMED: "not timed",
    Missing.NOT_MEASURED: "not measured",
    Missing.RANDOM_WEIGHTS: "not meaningful with random weights",
    Missing.NOT_MEANINGFUL: "not meaningful",
    Missing.UNLABELLED: "no labels",
    Missing.NOT_RECORDED: "not in this record",
}


def typed(d: Decision) -> bool:
    """Whether the decision's gates carry numbers (schema 6 and later)."""
    return all(g.metric is not None for g in d.gates)


def fmt_value(g: Gate, v: float) -> str:
    """A value of gate `g` in its metric's format; where that format would print it equal to
    the threshold it is not, with more digits (ratios and KL one more significant digit, else
    the record's full value), so a verdict never looks like a tie."""
    assert g.metric is not None
    fmt = _FORMAT[g.metric]
    s = fmt(v)
    if g.threshold is None or v == g.threshold or s != fmt(g.threshold):
        return s
    finer = fmt_fine(v) if g.metric in (GateMetric.SPEEDUP, GateMetric.KL_MEAN) else None
    return finer if finer is not None and finer != fmt_fine(g.threshold) else fmt_plain(v)


def threshold_words(g: Gate) -> str:
    assert g.metric is not None and g.threshold is not None
    if g.metric == GateMetric.NONFINITE:
        return "none"
    sign = ">=" if g.direction == Direction.AT_LEAST else "<="
    # a KL threshold is the policy's own number, shown as written (0.02, not 0.0200)
    fmt = (lambda v: f"{v:g}") if g.metric == GateMetric.KL_MEAN else _FORMAT[g.metric]
    return f"{sign} {fmt(g.threshold)}{_UNIT.get(g.metric, '')}"


def measured_words(g: Gate) -> str:
    if g.value is None:
        return MISSING_WORDS[g.missing] if g.missing else "not measured"
    return fmt_value(g, g.value) + _UNIT.get(g.metric, "") if g.metric else ""


def interval_words(g: Gate) -> str:
    if g.low is None or g.high is None:
        return "-"
    return f"[{fmt_value(g, g.low)}, {fmt_value(g, g.high)}]"


def status_words(g: Gate, markdown: bool = True) -> str:
    if g.status == GateStatus.FAIL:
        return "**fail**" if markdown else "FAIL"
    if g.status == GateStatus.PASS:
        return f"skipped: {g.skipped_reason}" if g.skipped_reason else "pass"
    if g.missing is not None:
        return f"inconclusive: {g.skipped_reason or MISSING_WORDS[g.missing]}"
    if g.images_needed is not None:
        return f"inconclusive (about {fmt_count(g.images_needed)} images)"
    return "inconclusive"


def settle_sentence(g: Gate) -> str:
    """What more data would show, for an inconclusive gate with an images-needed figure."""
    assert g.images_needed is not None and g.metric is not None and g.threshold is not None
    side = "at least" if g.direction == Direction.AT_LEAST else "at most"
    base = f" against {g.baseline}" if g.baseline else ""
    unit = _UNIT.get(g.metric, "")
    return (
        f"about {fmt_count(g.images_needed)} labelled held-out images would show whether "
        f"{_WHAT[g.metric]}{base} is {side} {_FORMAT[g.metric](g.threshold)}{unit}"
    )


def _names(gates: list[Gate]) -> str:
    return ", ".join(g.name for g in gates)


def summary_sentences(d: Decision) -> list[str]:
    """The decision's first sentences, from its gates."""
    if not typed(d):
        return [d.summary or f"{OUTCOME_WORDS[d.outcome].capitalize()} under {d.policy}."]
    gates = d.gates
    failed = [g for g in gates if g.status == GateStatus.FAIL]
    open_ = [g for g in gates if g.status == GateStatus.INCONCLUSIVE]
    level = f" ({fmt_level(d.confidence)} intervals)" if d.confidence is not None else ""
    if d.outcome == Outcome.SHIP:
        skipped = [g for g in gates if g.skipped_reason]
        note = f"; skipped: {_names(skipped)}" if skipped else ""
        out = [f"Shipped under {d.policy}{level}: all {len(gates)} gates passed{note}."]
    elif d.outcome == Outcome.NOT_SHIP:
        more = f"; {len(open_)} more inconclusive ({_names(open_)})" if open_ else ""
        out = [
            f"Not shipped under {d.policy}{level}: {len(failed)} of {len(gates)} gates failed, "
            f"their whole interval on the wrong side of the threshold ({_names(failed)}){more}."
        ]
    else:
        out = [
            f"Inconclusive under {d.policy}{level}: no gate failed, but {len(open_)} of "
            f"{len(gates)} cannot yet pass ({_names(open_)})."
        ]
    settle = [settle_sentence(g) for g in open_ if g.images_needed is not None]
    if settle:
        out.append("At the observed rates, " + "; ".join(settle) + ".")
    unrecorded = [g for g in open_ if g.missing == Missing.NOT_RECORDED]
    if unrecorded:
        out.append(
            f"This record does not hold the numbers for {_names(unrecorded)}; a study run "
            "with this version records them."
        )
    return out


def redecided_sentence(d: Decision) -> str | None:
    rd = d.redecided
    if rd is None:
        return None
    before = (
        f"the study's own decision was {OUTCOME_WORDS[rd.previous_outcome]} under "
        f"{rd.previous_policy}"
        if rd.previous_outcome is not None
        else "the study recorded no decision"
    )
    return (
        f"This decision was taken again by quantstudy {rd.tool_version} (schema "
        f"{rd.schema_version}) from the measurements recorded here, without re-running them; "
        f"{before}."
    )


def gate_table(d: Decision, sequential: bool = False) -> list[str]:
    """The gates as a table, and how their intervals were made (`sequential`: the quality
    gates come from a `--heldout auto` study's last look, `decision/sequential.py`)."""
    if not typed(d):
        return table(
            ["Gate", "Kind", "Threshold", "Measured", "Result"],
            [
                [g.name, g.kind, g.threshold_text or "-", g.measured or "-", status_words(g)]
                for g in d.gates
            ],
        )
    lines = table(
        ["Gate", "Baseline", "Measured", "Interval", "Threshold", "Result"],
        [
            [
                g.name,
                g.baseline or "-",
                measured_words(g) if g.value is not None else "-",
                interval_words(g),
                threshold_words(g),
                status_words(g),
            ]
            for g in d.gates
        ],
    )
    level = fmt_level(d.confidence) if d.confidence is not None else "-"
    quality = (
        f"{level} (top-1 change: Tango's paired score interval from the gained and lost counts; "
        "agreement: Wilson; KL mean: bootstrap over images)"
    )
    needed = (
        " Images needed: the held-out size at which, were the true rates the observed ones, the "
        "interval would settle four times in five (McNemar-type for the top-1 change, binomial "
        "for agreement; `decision/stats.py`)."
    )
    if sequential:
        quality = (
            f"{level} confidence sequences at the last look of the sequential study, valid at "
            "every look (see Sequential decision)"
        )
        needed = ""
    return [
        *lines,
        "",
        f"Intervals: speed, the first to third quartile of x over the timing rounds; quality, "
        f"{quality}. A gate passes when its whole interval is on the good side of the "
        "threshold, fails when it is wholly on the other side, and is inconclusive otherwise."
        + needed,
    ]


def cli_lines(d: Decision) -> list[str]:
    """The decision as the CLI prints it after a run."""
    lines = summary_sentences(d)
    r = redecided_sentence(d)
    if r:
        lines.append(r)
    for g in d.gates:
        mark = status_words(g, markdown=False).split(" ")[0].rstrip(":")
        if g.metric is None:
            lines.append(f"  [{mark}] {g.name}: {g.measured} (needs {g.threshold_text})")
            continue
        measured = measured_words(g)
        interval = f" {interval_words(g)}" if g.low is not None else ""
        extra = ""
        if g.status == GateStatus.INCONCLUSIVE and g.missing is not None:
            extra = f"; {g.skipped_reason or MISSING_WORDS[g.missing]}"
        elif g.status == GateStatus.INCONCLUSIVE and g.images_needed is not None:
            extra = f"; about {fmt_count(g.images_needed)} labelled images would settle it"
        lines.append(
            f"  [{mark}] {g.name}: {measured}{interval} (needs {threshold_words(g)}){extra}"
        )
    lines.append(f"policy: {code(d.policy)}")
    return lines
