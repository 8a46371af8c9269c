"""Check a rendered study report against its record: tables, code fences, and every number.

`check_markdown(md, record)` returns a list of problems (empty: the report passes):

1. Tables. A table is a run of lines starting with `|`. Its second line must be a separator row
   (`| --- | :-: |`), and the separator and every row must have as many cells as the header.
   Cells are split on unescaped `|`. A declared table (`report/sections/tables.py`, known by
   its header) is named in the message.
2. Code fences. Every fence (a line starting with three or more backticks or tildes) must be
   closed by a fence of the same character and at least the same length.
3. Title. The first `# ` heading says the record's outcome: "(shipped)", "(not shipped)" or
   "(inconclusive)" (records before schema 6: "(shipped)" exactly when the decision ships).
4. Numbers. Every number in the Markdown must come from the record. Precisely:

   Where numbers are looked for: every line outside code fences, after removing link and image
   targets (`](...)`), a list marker at the start of a line (`1. `) and a heading ordinal
   (`## 2. `). Inline code is checked like other text.

   What counts as a number: a maximal run of digits with optional dot-separated digit groups
   (`1500`, `0.480`, `2.14.1`), with a leading `-` when that minus is a sign (not preceded by a
   letter, digit, `_`, `)` or `]`), and with a trailing `%` when one follows. A run that is part
   of an identifier is not a number: preceded by a letter, `_` or `.` ("fp16", "H200", "p99",
   "blocks.1.0"), preceded by `-` after a letter ("top-1"), followed by a letter or `_` ("1x1",
   "e4m3", a hex digest) or by `.` and a letter. A trailing `x` that ends a word is a ratio mark
   ("1.05x") and does not make the number an identifier.

   When it comes from the record: the record is taken as its JSON form. Its values are
   (a) every numeric leaf (int or float; booleans are not numbers), (b) the length of every
   list and every mapping (counts such as the number of selected layers, or of the layers in an
   engine's layer -> epilogue map) and (c) the tally of each distinct text value in a list or
   mapping (the "gelu x6" of a layer -> activation map). Counting a collection the record holds
   is reading it, not deriving a new figure, so a report may say how many entries it has
   whatever the collection's JSON shape. The number must equal a number found
   (by the rule above) in `F(v)` for some value `v` and some formatter `F` of
   `quantstudy.report.format.FORMATTERS` (e.g. 0.8143 -> "81.43%" by `fmt_pct`, 0.48021 ->
   "0.480" by `fmt_ms`, -0.0013 -> "-0.13" by `fmt_points`), or equal a number found in a
   string of the record, keys included (versions, gate thresholds and measurements, warnings).
   A `%` is part of the number, so "81.43" and "81.43%" are different numbers.
5. Speed claims. A table cell that shows an x whose rounds the record says do not support the
   sign of the gain (its interval [q1, q3] contains 1.0, or its own warning says so), or a
   fraction of the ideal reached by that x, says "not settled" and shows no percentage: the
   speed table, the ideal x table and the variants table (`report/selfcheck_x.py`).

   The check is of provenance, not of meaning: a number that happens to equal some formatted
   value of an unrelated leaf passes. Derived values (differences, sums, ratios computed by the
   renderer) fail unless they also exist in the record, so the renderer does not compute them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from quantstudy.record import StudyRecord
from quantstudy.report.format import FORMATTERS
from quantstudy.report.sections.results import TABLE_SPECS
from quantstudy.report.selfcheck_x import cells as _cells
from quantstudy.report.selfcheck_x import study_problems

_DIGITS = re.compile(r"\d+(?:\.\d+)*")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_LIST_MARKER = re.compile(r"^(\s*)\d+[.)](\s)")
_HEADING_ORDINAL = re.compile(r"^(#{1,6}\s+)\d+(?:\.\d+)*[.)]?(\s)")
_SEPARATOR_CELL = re.compile(r"^\s*:?-{3,}:?\s*$")


def _word_char(c: str) -> bool:
    return c.isalpha() or c == "_"


def number_tokens(text: str) -> Iterator[str]:
    """The numbers of `text` by the module's rule, each as sign + digits (+ "%")."""
    n = len(text)
    for m in _DIGITS.finditer(text):
        s, e = m.span()
        prev = text[s - 1] if s > 0 else ""
        before = text[s - 2] if s > 1 else ""
        nxt = text[e] if e < n else ""
        after = text[e + 1] if e + 1 < n else ""
        if _word_char(prev) or prev == ".":
            continue
        sign = ""
        if prev in ("-", "+"):
            if _word_char(before):
                continue
            if prev == "-" and not (before.isalnum() or before in (")", "]")):
                sign = "-"
        if nxt == "x" and not (after.isalnum() or after == "_"):
            pass
        elif _word_char(nxt) or (nxt == "." and _word_char(after)):
            continue
        yield sign + m.group() + ("%" if nxt == "%" else "")


def _record_data(record: StudyRecord | dict[str, Any]) -> dict[str, Any]:
    if isinstance(record, BaseModel):
        return record.model_dump(mode="json")
    return record


def _add_counts(items: list[Any] | tuple[Any, ...], values: set[int | float]) -> None:
    """A collection's length and the tally of each text value in it (rule (b) and (c))."""
    values.add(len(items))
    values.update(Counter(item for item in items if isinstance(item, str)).values())


def allowed_numbers(record: StudyRecord | dict[str, Any]) -> set[str]:
    """Every number the report may print for this record (see the module docstring)."""
    values: set[int | float] = set()
    allowed: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, int | float):
            values.add(x)
        elif isinstance(x, str):
            allowed.update(number_tokens(x))
        elif isinstance(x, list | tuple):
            _add_counts(x, values)
            for item in x:
                walk(item)
        elif isinstance(x, dict):
            _add_counts(list(x.values()), values)
            for k, v in x.items():
                allowed.update(number_tokens(str(k)))
                walk(v)

    walk(_record_data(record))
    for v in values:
        for fmt in FORMATTERS:
            allowed.update(number_tokens(fmt(v)))
    return allowed


def _check_table(block: list[tuple[int, str]]) -> list[str]:
    problems = []
    (hline, header), rest = block[0], block[1:]
    width = len(_cells(header))
    if not rest:
        return [f"line {hline}: table has a header but no separator row"]
    sline, sep = rest[0]
    sep_cells = _cells(sep)
    if not all(_SEPARATOR_CELL.match(c) for c in sep_cells):
        problems.append(f"line {sline}: second table line is not a separator row")
    elif len(sep_cells) != width:
        problems.append(
            f"line {sline}: separator row has {len(sep_cells)} cells, header has {width}"
        )
    for lineno, row in rest[1:]:
        k = len(_cells(row))
        if k != width:
            problems.append(f"line {lineno}: {_row_of(header)} has {k} cells, header has {width}")
    return problems


def _row_of(header: str) -> str:
    """What a row is called in a problem: a declared table's (`TABLE_SPECS`) by name."""
    cells = [c.strip() for c in _cells(header)]
    spec = next((s for s in TABLE_SPECS if cells in s.variants()), None)
    return f"row of the {spec.name} table" if spec else "table row"


def _title_problem(lines: list[str], data: dict[str, Any]) -> str | None:
    title = next(((i, x) for i, x in enumerate(lines, 1) if x.startswith("# ")), None)
    if title is None:
        return "no title (a line starting with '# ')"
    decision = data.get("decision") or {}
    # outcome since schema 6; a boolean `ship` before
    outcome = decision.get("outcome") or ("ship" if decision.get("ship") else "not_ship")
    words = {"ship": "shipped", "not_ship": "not shipped", "inconclusive": "inconclusive"}
    lineno, text = title
    want = f"({words[outcome]})"
    if want not in text:
        return f"line {lineno}: title does not say {want} but the record's decision is {outcome}"
    return None


def check_markdown(md: str, record: StudyRecord | dict[str, Any]) -> list[str]:
    """Problems of a rendered report against its record; an empty list means it passes."""
    data = _record_data(record)
    allowed = allowed_numbers(data)
    lines = md.split("\n")
    problems: list[str] = []
    title = _title_problem(lines, data)
    if title:
        problems.append(title)

    fence: tuple[str, int, int] | None = None  # (char, length, line) of the open fence
    table: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, 1):
        fm = _FENCE.match(line)
        if fence is not None:
            if fm and fm.group(1)[0] == fence[0] and len(fm.group(1)) >= fence[1]:
                if not fm.group(2).strip():
                    fence = None
            continue
        if fm:
            if table:
                problems += _check_table(table)
                table = []
            fence = (fm.group(1)[0], len(fm.group(1)), lineno)
            continue
        if line.strip().startswith("|"):
            table.append((lineno, line))
        elif table:
            problems += _check_table(table)
            table = []
        text = _LINK_TARGET.sub("]", line)
        text = _HEADING_ORDINAL.sub(r"\1\2", text)
        text = _LIST_MARKER.sub(r"\1\2", text)
        for tok in number_tokens(text):
            if tok not in allowed:
                problems.append(f"line {lineno}: number {tok} does not come from the record")
    if table:
        problems += _check_table(table)
    if fence is not None:
        problems.append(f"line {fence[2]}: code fence opened here is never closed")
    return problems + study_problems(md, data)
