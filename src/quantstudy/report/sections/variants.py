"""Results: recipe variants studied next to the main recipe."""

from __future__ import annotations

from quantstudy.record import BatchSpeed, StudyRecord, Variant
from quantstudy.report.claims import claim_of
from quantstudy.report.format import NOT_MEASURED, code, fmt_pct, fmt_ratio, fmt_sig, opt, spread
from quantstudy.report.sections.tables import TableSpec, columns


def _variant_speed(speeds: list[BatchSpeed] | None) -> str:
    if not speeds:
        return NOT_MEASURED
    return "; ".join(
        f"batch {b.batch}: {claim_of(b).cell(spread(b.ratio, fmt_ratio))}" for b in speeds
    )


def _variant_row(v: Variant) -> list[str]:
    vq = v.quality
    return [
        v.name,
        code(v.recipe),
        str(v.selected_count),
        opt(vq.top1 if vq and vq.labelled else None, fmt_pct),
        fmt_pct(vq.agreement) if vq else NOT_MEASURED,
        str(vq.differ_count) if vq else NOT_MEASURED,
        fmt_sig(vq.kl_mean) if vq else NOT_MEASURED,
        _variant_speed(v.speed),
    ]


VARIANTS_TABLE = TableSpec(
    "recipe variants",
    columns(
        "Variant",
        "Recipe",
        "Selected",
        "Top-1",
        "Agreement",
        "Differ",
        "KL mean",
        "x median [q1, q3]",
    ),
    _variant_row,
)
TABLES = [VARIANTS_TABLE]


def render_variants(r: StudyRecord) -> list[str]:
    lines = ["### Variants", ""]
    if not r.variants:
        return [*lines, "No recipe variant was studied.", ""]
    lines += VARIANTS_TABLE.render(r.variants)
    warn = [(v.name, b.batch, w) for v in r.variants for b in (v.speed or []) for w in b.warnings]
    lines.append("")
    for name, batch, w in warn:
        lines.append(f"- {name}, batch {batch}: {w}")
    if warn:
        lines.append("")
    return lines
