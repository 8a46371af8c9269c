"""The self-check's rule for x: no table shows a settled gain that its record's rounds do not
support.

An x is unsettled where its record says so: the interval [q1, q3] of the per-round ratio
contains 1.0 (`report/claims.py`), or the record's own speed warnings say that these rounds do
not support the sign of the gain (`speed/stats.py: speed_warnings`). A table cell that shows
such an x, or the fraction of the ideal reached by it, must carry the mark "not settled" and no
percentage. `unsettled_shown` holds the rule for any Markdown table, given which (row, column)
cells are unsettled; `study_problems` applies it to a study report's tables (speed, ideal x,
variants), and the zoo page applies it to its own (`zoo/page_check.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from quantstudy.report.claims import NOT_SETTLED, XClaim

UNSUPPORTED = "do not support the sign of the gain"  # the study's warning (`speed/stats.py`)


@dataclass(frozen=True)
class Unsettled:
    """A cell that shows an x the record's rounds do not support: the row named `row` in the
    table's `key` column, the column headed `column`; `part`: where the cell holds several
    batches ("batch 128: ..."; "; " between them), the one that starts with it."""

    key: str
    row: str
    column: str
    part: str | None = None


def unsupported(claim: XClaim, warnings: Iterable[str] = ()) -> bool:
    """The record says these rounds do not support the sign of x: its interval, or its own
    warning."""
    return (claim.measured and not claim.settled) or any(UNSUPPORTED in w for w in warnings)


def cells(line: str) -> list[str]:
    """The cells of a table line, stripped; split on unescaped `|`."""
    body = line.strip().removeprefix("|")
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def tables(md: str) -> Iterator[tuple[list[str], list[tuple[int, list[str]]]]]:
    """Each Markdown table of `md`: its header cells and (line, cells) of each body row."""
    block: list[tuple[int, str]] = []
    for lineno, line in enumerate([*md.split("\n"), ""], 1):
        if line.strip().startswith("|"):
            block.append((lineno, line))
            continue
        if len(block) > 2:
            yield cells(block[0][1]), [(n, cells(text)) for n, text in block[2:]]
        block = []


def _shown(cell: str, part: str | None) -> str | None:
    """The text of `cell` that shows the x (its `part`); None where the cell does not hold it."""
    if part is None:
        return cell
    return next((p for p in cell.split("; ") if p.startswith(part)), None)


def unsettled_shown(md: str, unsettled: Iterable[Unsettled], what: str) -> list[str]:
    """Problems: each cell of `unsettled` that a table of `md` shows without the mark "not
    settled", or with a percentage (a fraction of the ideal, for an x that is not settled)."""
    wanted = list(unsettled)
    problems = []
    for head, rows in tables(md):
        for u in wanted:
            if u.key not in head or u.column not in head:
                continue
            k, c = head.index(u.key), head.index(u.column)
            for lineno, row in rows:
                if len(row) != len(head) or row[k] != u.row:
                    continue
                text = _shown(row[c], u.part)
                if text is not None and (NOT_SETTLED not in text or "%" in text):
                    problems.append(
                        f"line {lineno}: {what} shows {u.column!r} of {u.row} as settled "
                        f"({text}), but its record says these rounds {UNSUPPORTED}"
                    )
    return problems


def _claim(batch: dict[str, Any]) -> XClaim:
    """The claim of one batch of a record's JSON form (`BatchSpeed`)."""
    ratio, fp16, fp8 = batch["ratio"], batch["fp16_ms"], batch["fp8_ms"]
    return XClaim(
        x=ratio["median"],
        q1=ratio["q1"],
        q3=ratio["q3"],
        fp16_ms=fp16["median"],
        fp8_ms=fp8["median"],
    )


def _unsupported(batch: dict[str, Any]) -> bool:
    return unsupported(_claim(batch), batch.get("warnings") or [])


def study_cells(data: dict[str, Any]) -> list[Unsettled]:
    """The cells of a study report that show an unsupported x: the speed table's x, the ideal
    table's measured x and its fraction, and each variant's x at that batch."""
    found = []
    for b in (data.get("speed") or {}).get("batches") or []:
        if _unsupported(b):
            batch = str(b["batch"])
            found += [Unsettled("Batch", batch, c) for c in SPEED_COLUMNS]
    for v in data.get("variants") or []:
        for b in v.get("speed") or []:
            if _unsupported(b):
                part = f"batch {b['batch']}:"
                found.append(Unsettled("Variant", v["name"], VARIANT_X, part))
    return found


SPEED_COLUMNS = ("x median [q1, q3]", "measured x", "fraction of ideal")
VARIANT_X = "x median [q1, q3]"


def study_problems(md: str, data: dict[str, Any]) -> list[str]:
    """The rule on a study report's tables, against its record's JSON form."""
    return unsettled_shown(md, study_cells(data), "the report")
