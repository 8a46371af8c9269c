"""Number formatters and Markdown helpers shared by every section of the report.

The formatters are the only way a number reaches the Markdown: `report/selfcheck.py` applies
`FORMATTERS` to every numeric leaf of the record to verify that each number in the Markdown comes
from it, so a number printed any other way fails that check.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from quantstudy.record import TimingStats

COLLAPSE_ROWS = 12  # tables longer than this go into <details>
NOT_MEASURED = "not measured"


# --- formatters: the only way a number reaches the Markdown --------------------------------


def fmt_plain(v: float) -> str:
    """The value as the record holds it: integers exactly, floats by their shortest repr."""
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def fmt_ms(v: float) -> str:
    """Milliseconds, 3 decimals."""
    return f"{v:.3f}"


def fmt_us(v: float) -> str:
    """Microseconds, 1 decimal."""
    return f"{v:.1f}"


def fmt_ratio(v: float) -> str:
    """Ratios (x = fp16 ms / FP8 ms), 2 decimals."""
    return f"{v:.2f}"


def fmt_pct(v: float) -> str:
    """A fraction as a percentage, 2 decimals: 0.8153 -> 81.53%."""
    return f"{100 * v:.2f}%"


def fmt_points(v: float) -> str:
    """A difference of fractions in percentage points, signed, 2 decimals: -0.0013 -> -0.13."""
    return f"{100 * v:+.2f}"


def fmt_sig(v: float) -> str:
    """Small quantities (KL, p-values, scales): 3 significant digits, never in e-notation, and
    trailing zeros kept (0.0100, not 0.01: the digits shown are the digits measured)."""
    return np.format_float_positional(v, precision=3, unique=False, fractional=False, trim="k")


def fmt_fine(v: float) -> str:
    """A ratio or KL that its usual format would print equal to a threshold it is not: one
    more significant digit (1.052 against 1.05), not the record's full float."""
    return np.format_float_positional(v, precision=4, unique=False, fractional=False, trim="k")


def fmt_mib(v: float) -> str:
    """Bytes as MiB, 2 decimals."""
    return f"{v / 1048576:.2f}"


def fmt_count(v: float) -> str:
    """Counts with thousands separators: 6800 -> 6,800."""
    return f"{int(v):,}" if float(v).is_integer() else fmt_plain(v)


def fmt_level(v: float) -> str:
    """A confidence level as a percentage, no trailing zeros: 0.95 -> 95%, 0.995 -> 99.5%."""
    return f"{100 * v:g}%"


FORMATTERS: tuple[Callable[[float], str], ...] = (
    fmt_plain,
    fmt_ms,
    fmt_us,
    fmt_ratio,
    fmt_pct,
    fmt_points,
    fmt_sig,
    fmt_fine,
    fmt_mib,
    fmt_count,
    fmt_level,
)


# --- Markdown helpers ----------------------------------------------------------------------


def _cell(s: object) -> str:
    return str(s).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def code(s: str) -> str:
    s = str(s).replace("\n", " ")
    if "`" in s:
        return f"`` {s} ``"
    return f"`{s}`"


def table(header: list[str], rows: Iterable[Sequence[object]]) -> list[str]:
    rows = list(rows)
    for row in rows:
        assert len(row) == len(header), (header, row)
    out = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    out.append("|" + "|".join(" --- " for _ in header) + "|")
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def maybe_collapsed(summary: str, lines: list[str], n_rows: int) -> list[str]:
    if n_rows <= COLLAPSE_ROWS:
        return [*lines, ""]
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def fence(text: str, lang: str = "text") -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [ticks + lang, *text.splitlines(), ticks]


def spread(t: TimingStats, fmt: Callable[[float], str]) -> str:
    return f"{fmt(t.median)} [{fmt(t.q1)}, {fmt(t.q3)}]"


def opt(v: float | int | None, fmt: Callable[[float], str], missing: str = NOT_MEASURED) -> str:
    return missing if v is None else fmt(v)


def hw(v: tuple[int, int] | None) -> str:
    return "n/a" if v is None else f"{v[0]} x {v[1]}"


def join_words(items: list[str]) -> str:
    if not items:
        return "none"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]
