"""Results: quality against the reference, the FP8 engine against its emulation, NaN/Inf scan."""

from __future__ import annotations

from quantstudy.record import EmulationGap, EngineQuality, NonFiniteScan, StudyRecord
from quantstudy.report.format import NOT_MEASURED, fmt_pct, fmt_points, fmt_sig, opt
from quantstudy.report.lookups import RANDOM_WEIGHTS_BANNER, label
from quantstudy.report.plots import KL_PNG
from quantstudy.report.sections.tables import TableSpec, columns

NO_LABELS = "no labels"


def _quality_row(e: EngineQuality) -> list[str]:
    nl = NO_LABELS
    change = nl
    if e.labelled:
        change = opt(e.top1_change, fmt_points)
        if e.ci_low is not None and e.ci_high is not None:
            change += f" [{fmt_points(e.ci_low)}, {fmt_points(e.ci_high)}]"
    return [
        label(e.engine),
        opt(e.top1, fmt_pct) if e.labelled else nl,
        opt(e.top5, fmt_pct) if e.labelled else nl,
        fmt_pct(e.agreement),
        str(e.differ_count),
        opt(e.gained, str) if e.labelled else nl,
        opt(e.lost, str) if e.labelled else nl,
        opt(e.net_change, lambda v: f"{v:+d}") if e.labelled else nl,
        change,
        opt(e.mcnemar_p, fmt_sig) if e.labelled else nl,
        fmt_sig(e.kl_mean),
        fmt_sig(e.kl_median),
        fmt_sig(e.kl_p99),
        fmt_sig(e.kl_max),
    ]


QUALITY_TABLE = TableSpec(
    "quality per engine",
    columns(
        "Engine",
        "Top-1",
        "Top-5",
        "Agreement",
        "Differ",
        "Gained",
        "Lost",
        "Net",
        "Top-1 change, points [CI]",
        "McNemar p",
        "KL mean",
        "KL median",
        "KL p99",
        "KL max",
    ),
    _quality_row,
)


def _gap_rows(gap: EmulationGap) -> list[list[str]]:
    rows = [
        [
            "FP8 engine vs fake-quant emulation",
            fmt_pct(gap.agreement),
            str(gap.differ_count),
            fmt_sig(gap.kl_mean),
            fmt_sig(gap.kl_max),
        ]
    ]
    others = (
        ("FP8 engine built in float32 vs fake-quant emulation", "float32"),
        ("emulation vs itself, fp32 sums reordered (floor)", "floor"),
        (f"emulation vs itself, values stored in {gap.half_floor_dtype} (floor)", "half_floor"),
    )
    for name, key in others:  # recorded without their KL max
        agreement = getattr(gap, f"{key}_agreement")
        if agreement is not None:
            differ, kl = getattr(gap, f"{key}_differ_count"), getattr(gap, f"{key}_kl_mean")
            rows.append(
                [name, fmt_pct(agreement), opt(differ, str), opt(kl, fmt_sig), "not recorded"]
            )
    return rows


EMULATION_GAP_TABLE = TableSpec(
    "emulation gap",
    columns("Comparison", "Agreement", "Differ", "KL mean", "KL max"),
    lambda row: row,  # the rows differ in kind; `_gap_rows` builds them
)


def _nonfinite_row(s: NonFiniteScan) -> list[str]:
    return [
        label(s.engine),
        str(s.heldout_checked),
        str(s.stress_checked),
        ", ".join(s.nonfinite_heldout) or "none",
        ", ".join(s.nonfinite_stress) or "none",
    ]


NONFINITE_TABLE = TableSpec(
    "NaN/Inf scan",
    columns(
        "Engine", "Held-out checked", "Stress checked", "Non-finite held-out", "Non-finite stress"
    ),
    _nonfinite_row,
)
TABLES = [QUALITY_TABLE, EMULATION_GAP_TABLE, NONFINITE_TABLE]


def _random(r: StudyRecord) -> bool:
    return r.model.random_weights or (r.quality is not None and not r.quality.meaningful)


def render_quality(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Quality", ""]
    q = r.quality
    if q is None:
        why = " (`--no-quality`: a speed-only study)" if not r.config.quality else ""
        return [*lines, f"Quality: {NOT_MEASURED}{why}.", ""]
    if _random(r):
        words = RANDOM_WEIGHTS_BANNER if r.model.random_weights else "quality is not meaningful"
        lines += [f"**Warning: {words}.**", ""]
    first = next((e for e in q.engines), None)
    n = f"{first.n_images} held-out images" if first else "the held-out images"
    balance = ""
    if q.n_classes is not None and q.per_class_min is not None and q.per_class_max is not None:
        balance = (
            f" over {q.n_classes} classes (images per class: min {q.per_class_min}, max "
            f"{q.per_class_max})"
        )
    lines += [
        f"Against {q.reference}, on {n}{balance}. Agreement is top-1 agreement with "
        f"{q.reference}; Differ counts the images whose top-1 differs from {q.reference}. "
        "Gained and lost count images the engine gets right where the reference is wrong and "
        "the reverse; Net is their difference; the two can be small while many predictions "
        "differ.",
        "",
    ]
    first_rows = []
    ref = next((e for e in q.engines if e.top1_reference is not None), None)
    if ref is not None and not any(e.engine == q.reference for e in q.engines):
        width = len(QUALITY_TABLE.header())
        first_rows.append(
            [label(q.reference), opt(ref.top1_reference, fmt_pct), opt(ref.top5_reference, fmt_pct)]
            + ["reference"] * (width - 3)
        )
    lines += QUALITY_TABLE.render(q.engines, first=first_rows)
    lines.append("")
    if KL_PNG in plots:
        lines += [f"![Per-image KL distribution per engine, log x]({KL_PNG})", ""]
    return [*lines, *_emulation_gap(q.emulation_gap), *_nonfinite(q.nonfinite)]


def _emulation_gap(gap: EmulationGap | None) -> list[str]:
    lines = ["### Emulation gap", ""]
    if gap is None:
        return [*lines, f"FP8 engine against its fake-quant emulation: {NOT_MEASURED}.", ""]
    lines += EMULATION_GAP_TABLE.render(_gap_rows(gap))
    if gap.floor_agreement is not None:
        lines += [
            "",
            "The floor row runs the emulation again with only its memory layout changed "
            "(channels-last), which reorders fp32 sums. FP8 rounding amplifies such tiny "
            "differences to the size of the quantization noise over the network's depth, so "
            "no distinct kernel can be expected to agree with the emulation better than the "
            "floor; an engine near the floor computes what the recipe prescribes.",
        ]
    if gap.float32_agreement is not None:
        lines += [
            "",
            "The float32 row builds the same FP8 engine (the same FP8 layers, epilogues and "
            "hand-offs) in float32 and runs it eagerly: its distance from the emulation is the "
            "FP8 arithmetic's alone (on a GPU, with the FP8 tensor cores' own rounding of their "
            "sums), and what the engine adds beyond it is the half-precision storage between its "
            "layers, which FP8 rounding amplifies like any perturbation.",
        ]
    if gap.half_floor_agreement is not None:
        lines += [
            "",
            f"The {gap.half_floor_dtype} floor row runs the emulation again with every layer's "
            "output and the parameters outside the FP8 layers rounded to "
            f"{gap.half_floor_dtype}, the arithmetic still fp32: one correct implementation of "
            "the recipe that stores values "
            "as the half-precision engines do. An FP8 engine storing in that dtype between "
            "its layers can be expected to agree with the emulation about this well, not better.",
        ]
    return [*lines, "", _split_sentence(gap), ""]


def _split_sentence(gap: EmulationGap) -> str:
    """Which of the two differs from fp32 where only one does, where the record has it."""
    if (
        gap.engine_only_differ is None
        or gap.emulation_only_differ is None
        or gap.split_mcnemar_p is None
    ):
        return (
            "A per-image comparison of top-1: an image where the FP8 engine differs from fp32 "
            "but its emulation does not is one where the two disagree, so at most "
            f"{gap.differ_count} of the FP8 engine's differences from fp32 are not reproduced "
            "by the emulation of the recipe. KL is compared only as a mean and maximum here."
        )
    words = (
        f"Against fp32, the FP8 engine alone differs on {gap.engine_only_differ} images and "
        f"its emulation alone on {gap.emulation_only_differ}: those are the FP8 engine's "
        "differences from fp32 that the emulation of the recipe does not reproduce, and the "
        "reverse. McNemar's exact test on that split, p = "
        f"{fmt_sig(gap.split_mcnemar_p)}, is how often a split at least this uneven arises "
        "when the engine loses no more images than this run of its emulation. The emulation "
        "is itself one of many equally correct computations of the recipe"
    )
    if (
        gap.floor_only_differ is None
        or gap.floor_emulation_only_differ is None
        or gap.floor_split_mcnemar_p is None
    ):
        return (
            f"{words}, so a small p says the engine lost more images than this run of the "
            "emulation did, not that it computes the recipe worse. KL is compared only as a "
            "mean and maximum here."
        )
    return (
        f"{words}: its floor run (channels-last) alone differs on {gap.floor_only_differ} "
        f"images and it alone on {gap.floor_emulation_only_differ} (p = "
        f"{fmt_sig(gap.floor_split_mcnemar_p)}). An engine whose split is no more uneven than "
        "the floor's loses images at a rate two correct computations of the recipe already "
        "differ by. KL is compared only as a mean and maximum here."
    )


def _nonfinite(scans: list[NonFiniteScan]) -> list[str]:
    lines = ["### NaN/Inf scan", ""]
    if not scans:
        return [*lines, f"NaN/Inf scan: {NOT_MEASURED}.", ""]
    return [*lines, *NONFINITE_TABLE.render(scans), ""]
