"""Two speed tables of the report: measured x against the ideal x at the FP8 roofline
(`speed/ideal.py`), per batch size; and what each FP8 layer runs in a "fastest" engine (an
FP8 kernel, or its float layer where it stepped aside) with the in-place timings that chose it
(`engines/kernel_choice.py`). A record without the fields renders nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quantstudy.record import IdealSpeed, LayerKernel
from quantstudy.report.claims import NOT_SETTLED, XClaim
from quantstudy.report.format import NOT_MEASURED, code, fmt_ms, fmt_pct, fmt_ratio, fmt_us
from quantstudy.report.sections.tables import TableSpec, columns


def _ideal_row(item: tuple[IdealSpeed, XClaim | None]) -> list[str]:
    """The measured x with its marks; its fraction of the ideal only where x is settled and
    short of the ideal (`XClaim.ideal` says why)."""
    i, claim = item
    measured, fraction = fmt_ratio(i.measured_x), fmt_pct(i.fraction)
    if claim is not None:
        measured = claim.cell(measured)
        if not claim.settled:
            fraction = f"x {NOT_SETTLED}"
        elif i.fraction >= 1:
            fraction = "at or over the ideal"
    return [
        str(i.batch),
        str(i.layers),
        fmt_us(i.fp16_products_us),
        fmt_us(i.fp16_elementwise_us),
        fmt_us(i.fp8_roofline_us),
        fmt_ms(i.fp16_ms),
        fmt_ratio(i.ideal_x),
        measured,
        fraction,
    ]


def _us(v: float | None) -> str:
    return fmt_us(v) if v is not None else NOT_MEASURED


def _choice_row(c: LayerKernel) -> list[str]:
    batch = str(c.batch) if c.batch is not None else "-"
    return [
        c.name,
        str(c.kernel),
        _us(c.fused_us),
        _us(c.scaled_mm_us),
        _us(c.fp16_us),
        batch,
        c.why or "-",
    ]


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
    columns(
        "Layer",
        "Kernel",
        "fused us",
        "scaled_mm us",
        "fp16 us",
        "Timed at batch",
        "Not timed because",
    ),
    _choice_row,
)
TABLES = [IDEAL_TABLE, KERNEL_CHOICE_TABLE]


def ideal_lines(
    ideal: list[IdealSpeed] | None, claims: Mapping[int, XClaim] | None = None
) -> list[str]:
    """The table and one sentence on how the ideal is computed, for a record's `speed.ideal`,
    each measured x read through its batch's claim (`claims`, by batch); [] without it."""
    if not ideal:
        return []
    lines = [
        "Limit: the ideal x if every selected layer, its product and its bias/activation, ran "
        "at the FP8 roofline and the rest of the engine as in the fp16 engine "
        "(`speed/ideal.py`; " + ideal[0].peaks + "). Measured x as a fraction of it:",
        "",
    ]
    found = claims or {}
    return [*lines, *IDEAL_TABLE.render((i, found.get(i.batch)) for i in ideal), ""]


def kernel_choice_lines(
    choice: list[LayerKernel] | None, stepped_aside: Sequence[str] = ()
) -> list[str]:
    """Per FP8 layer: what it runs, the in-place times and why a layer was not timed, and the
    layers kept in fp16 (`stepped_aside`, the engine's list); [] for an engine that made no
    choice."""
    if not choice:
        return []
    layers = len({c.name for c in choice} - set(stepped_aside))
    batches = sorted({c.batch for c in choice if c.batch is not None})
    scaled_mm = [c for c in choice if c.kernel == "scaled_mm"]
    picked = [sum(c.batch == b for c in scaled_mm) for b in batches]
    runs = "; ".join(f"at batch {b}, {n} of {layers}" for b, n in zip(batches, picked, strict=True))
    lines = [
        "FP8 kernel per layer: the fastest of the fused product, torch._scaled_mm and the float "
        "layer in the engine's dtype, timed in place at engine build at each timed batch "
        "(`engines/kernel_choice.py`); the float layer replaces an FP8 layer only where it is "
        "faster at every timed batch, so the engine computes the same numbers at every batch "
        f"(`engines/step_aside.py`). scaled_mm runs {runs or f'0 of {layers}'} FP8 layers.",
        "",
    ]
    if stepped_aside:
        names = ", ".join(code(n) for n in stepped_aside)
        lines[0] += (
            f" Kept in fp16 (FP8 slower at every timed batch): {len(stepped_aside)} "
            f"{'layer' if len(stepped_aside) == 1 else 'layers'}, {names}."
        )
    return [*lines, *KERNEL_CHOICE_TABLE.render(choice), ""]
