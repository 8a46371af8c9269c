"""Two speed tables of the report: measured x against the ideal x at the FP8 roofline
(`speed/ideal.py`), per batch size; and the product each FP8 layer runs in a "fastest" engine
with the in-place timings that chose it (`engines/kernel_choice.py`). A record without the
fields renders nothing."""

from __future__ import annotations

from quantstudy.record import IdealSpeed, LayerKernel
from quantstudy.record.vocab import Fp8Kernel
from quantstudy.report.format import NOT_MEASURED, fmt_ms, fmt_pct, fmt_ratio, fmt_us
from quantstudy.report.sections.tables import TableSpec, columns


def _ideal_row(i: IdealSpeed) -> list[str]:
    return [
        str(i.batch),
        str(i.layers),
        fmt_us(i.fp16_products_us),
        fmt_us(i.fp16_elementwise_us),
        fmt_us(i.fp8_roofline_us),
        fmt_ms(i.fp16_ms),
        fmt_ratio(i.ideal_x),
        fmt_ratio(i.measured_x),
        fmt_pct(i.fraction),
    ]


def _us(v: float | None) -> str:
    return fmt_us(v) if v is not None else NOT_MEASURED


def _choice_row(c: LayerKernel) -> list[str]:
    batch = str(c.batch) if c.batch is not None else "-"
    return [c.name, str(c.kernel), _us(c.fused_us), _us(c.scaled_mm_us), batch, c.why or "-"]


IDEAL_TABLE = TableSpec(
    "ideal x",
    columns(
        "Batch",
        "Layers priced",
        "fp16 products us",
        "fp16 bias/act passes us",
        "FP8 roofline us",
        "fp16 ms",
        "ideal x",
        "measured x",
        "fraction of ideal",
    ),
    _ideal_row,
)
KERNEL_CHOICE_TABLE = TableSpec(
    "FP8 kernel per layer",
    columns("Layer", "Kernel", "fused us", "scaled_mm us", "Timed at batch", "Not timed because"),
    _choice_row,
)
TABLES = [IDEAL_TABLE, KERNEL_CHOICE_TABLE]


def ideal_lines(ideal: list[IdealSpeed] | None) -> list[str]:
    """The table and one sentence on how the ideal is computed, for a record's `speed.ideal`;
    [] without it."""
    if not ideal:
        return []
    lines = [
        "Limit: the ideal x if every selected layer, its product and its bias/activation, ran "
        "at the FP8 roofline and the rest of the engine as in the fp16 engine "
        "(`speed/ideal.py`; " + ideal[0].peaks + "). Measured x as a fraction of it:",
        "",
    ]
    return [*lines, *IDEAL_TABLE.render(ideal), ""]


def kernel_choice_lines(choice: list[LayerKernel] | None) -> list[str]:
    """Per FP8 layer: the product it runs, both in-place times and why a layer was not timed;
    [] for an engine that made no choice."""
    if not choice:
        return []
    layers = len({c.name for c in choice})
    batches = sorted({c.batch for c in choice if c.batch is not None})
    scaled_mm = [c for c in choice if c.kernel == Fp8Kernel.SCALED_MM]
    picked = [sum(c.batch == b for c in scaled_mm) for b in batches]
    runs = "; ".join(f"at batch {b}, {n} of {layers}" for b, n in zip(batches, picked, strict=True))
    lines = [
        f"FP8 kernel per layer: the faster of the fused product and torch._scaled_mm, timed in "
        f"place at engine build at each timed batch (`engines/kernel_choice.py`); scaled_mm runs "
        f"{runs or f'0 of {layers}'} layers.",
        "",
    ]
    return [*lines, *KERNEL_CHOICE_TABLE.render(choice), ""]
