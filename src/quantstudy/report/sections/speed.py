"""Results: speed and size (the latency table and plot, weight and compiled-package bytes)."""

from __future__ import annotations

from quantstudy.record import BatchSpeed, StudyRecord
from quantstudy.report.claims import claim_of, legend
from quantstudy.report.format import NOT_MEASURED, fmt_mib, fmt_ms, fmt_ratio, spread
from quantstudy.report.lookups import CPU_BANNER, FP8, FP16, label, weight_bytes
from quantstudy.report.plots import LATENCY_PNG
from quantstudy.report.sections.ideal import TABLES as LIMIT_TABLES
from quantstudy.report.sections.ideal import ideal_lines, kernel_choice_lines
from quantstudy.report.sections.tables import TableSpec, columns


def _speed_row(item: tuple[BatchSpeed, str, str]) -> list[str]:
    b, w16, w8 = item
    return [
        str(b.batch),
        spread(b.fp16_ms, fmt_ms),
        spread(b.fp8_ms, fmt_ms),
        claim_of(b).cell(spread(b.ratio, fmt_ratio)),
        str(b.ratio.n),
        w16,
        w8,
    ]


SPEED_TABLE = TableSpec(
    "speed per batch",
    columns(
        "Batch",
        "fp16 ms median [q1, q3]",
        "FP8 ms median [q1, q3]",
        "x median [q1, q3]",
        "Rounds",
        "fp16 weights MiB",
        "FP8 weights MiB",
    ),
    _speed_row,
)


def _bytes_row(item: tuple[str, int]) -> list[str]:
    engine, n = item
    return [label(engine), str(n), fmt_mib(n)]


WEIGHT_BYTES_TABLE = TableSpec("weight bytes", columns("Engine", "Weight bytes", "MiB"), _bytes_row)
PACKAGE_BYTES_TABLE = TableSpec(
    "compiled package bytes", columns("Engine", "Compiled package bytes", "MiB"), _bytes_row
)
TABLES = [SPEED_TABLE, WEIGHT_BYTES_TABLE, PACKAGE_BYTES_TABLE, *LIMIT_TABLES]


def render_speed(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Speed and size", ""]
    sp = r.speed
    wb = weight_bytes(r)
    if sp is None or not sp.batches:
        lines += [f"Speed: {NOT_MEASURED}.", ""]
    else:
        if not sp.meaningful:
            words = CPU_BANNER if "cuda" not in sp.device.lower() else "timings are not meaningful"
            lines += [f"**Warning: {words}** ({sp.meaningless_reason or sp.device}).", ""]
        w16 = fmt_mib(wb[FP16]) if FP16 in wb else NOT_MEASURED
        w8 = fmt_mib(wb[FP8]) if FP8 in wb else NOT_MEASURED
        lines += SPEED_TABLE.render((b, w16, w8) for b in sp.batches)
        lines += ["", *legend([claim_of(b) for b in sp.batches]), ""]
        if LATENCY_PNG in plots:
            lines += [f"![Latency per batch, fp16 and FP8, with q1 to q3]({LATENCY_PNG})", ""]
        warn = [(b.batch, w) for b in sp.batches for w in b.warnings]
        for batch, w in warn:
            lines.append(f"- Batch {batch}: {w}")
        if warn:
            lines.append("")
        lines += ideal_lines(sp.ideal, {b.batch: claim_of(b) for b in sp.batches})
        fp8 = r.engine(FP8)
        if fp8 is not None:
            lines += kernel_choice_lines(fp8.layout.kernel_choice, fp8.layout.stepped_aside)
    if wb:
        lines += WEIGHT_BYTES_TABLE.render(wb.items())
        lines.append("")
    if sp is not None and sp.package_bytes:
        lines += PACKAGE_BYTES_TABLE.render(sp.package_bytes.items())
        lines.append("")
    else:
        lines += ["Compiled package size: not measured.", ""]
    return lines
