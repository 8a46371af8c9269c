"""Results: profiler kernel time per kernel group, and the largest kernels."""

from __future__ import annotations

from quantstudy.record import KernelBreakdown, StudyRecord
from quantstudy.record.vocab import KernelGroup, choices
from quantstudy.report.format import NOT_MEASURED, code, fmt_us, maybe_collapsed
from quantstudy.report.lookups import label
from quantstudy.report.plots import KERNELS_PNG
from quantstudy.report.sections.tables import TableSpec, columns

KERNEL_GROUPS = choices(KernelGroup)


def _group_row(k: KernelBreakdown) -> list[str]:
    cells = []
    for name in KERNEL_GROUPS:
        g = next((g for g in k.groups if g.group == name), None)
        cells.append("none" if g is None else f"{fmt_us(g.time_us)} ({g.count})")
    return [label(k.engine), str(k.batch), str(k.kernel_count), fmt_us(k.total_us), *cells]


KERNEL_GROUP_TABLE = TableSpec(
    "kernel time per group",
    columns("Engine", "Batch", "Kernels", "Total us", *KERNEL_GROUPS),
    _group_row,
)


def _top_row(item: tuple[KernelBreakdown, str, float]) -> list[str]:
    k, name, us = item
    return [label(k.engine), str(k.batch), code(name), fmt_us(us)]


TOP_KERNELS_TABLE = TableSpec(
    "largest kernels", columns("Engine", "Batch", "Kernel", "us"), _top_row
)
TABLES = [KERNEL_GROUP_TABLE, TOP_KERNELS_TABLE]


def render_kernels(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Kernel time per group", ""]
    sp = r.speed
    if sp is None or not sp.kernels:
        return [*lines, f"Kernel time per group: {NOT_MEASURED}.", ""]
    lines += [
        "Profiler time per call in microseconds, by kernel group (kernel count in brackets).",
        "",
    ]
    lines += KERNEL_GROUP_TABLE.render(sp.kernels)
    lines.append("")
    if KERNELS_PNG in plots:
        lines += [f"![Kernel time per group per engine]({KERNELS_PNG})", ""]
    top = [(k, name, us) for k in sp.kernels for name, us in k.top_kernels]
    if top:
        tt = TOP_KERNELS_TABLE.render(top)
        lines += ["Largest kernels:", ""]
        lines += maybe_collapsed("largest kernels per engine and batch", tt, len(top))
    return lines
