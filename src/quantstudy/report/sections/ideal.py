"""The speed section's "how close to the limit" table: measured x against the ideal x at the FP8
roofline (`speed/ideal.py`), per batch size. A record without the field renders nothing."""

from __future__ import annotations

from quantstudy.record import IdealSpeed
from quantstudy.report.format import fmt_ms, fmt_pct, fmt_ratio, fmt_us, table


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
    lines += table(
        [
            "Batch",
            "Layers priced",
            "fp16 products us",
            "fp16 bias/act passes us",
            "FP8 roofline us",
            "fp16 ms",
            "ideal x",
            "measured x",
            "fraction of ideal",
        ],
        [
            [
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
            for i in ideal
        ],
    )
    return [*lines, ""]
