"""Declarative report tables: each table's column headers and the function that gives one row.

A section renders a table through its spec (`spec.render(items)`), and `report/selfcheck.py`
reads the same specs (`TABLE_SPECS`) to check that a rendered table with a spec's header has that
many cells in every row. Columns of a `group` appear only when the section turns the group on
(e.g. the all-but columns of the sensitivity table).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from quantstudy.report.format import table


@dataclass(frozen=True)
class Column:
    header: str
    group: str | None = None  # None: always shown


@dataclass(frozen=True)
class TableSpec:
    """One report table: its columns and the row function, item -> cells (one per shown
    column, in order)."""

    name: str
    columns: tuple[Column, ...]
    row: Callable[[Any], list[str]]

    def header(self, groups: Iterable[str] = ()) -> list[str]:
        on = set(groups)
        return [c.header for c in self.columns if c.group is None or c.group in on]

    def variants(self) -> list[list[str]]:
        """The header with every combination of its groups turned on or off."""
        names = sorted({c.group for c in self.columns if c.group is not None})
        combos = [
            [n for i, n in enumerate(names) if mask >> i & 1] for mask in range(2 ** len(names))
        ]
        return [self.header(on) for on in combos]

    def render(
        self, items: Iterable[Any], groups: Iterable[str] = (), first: Iterable[list[str]] = ()
    ) -> list[str]:
        """The Markdown table of `items`; `first`: rows built by the caller, put on top."""
        return table(self.header(groups), [*first, *(self.row(i) for i in items)])


def columns(*headers: str, group: str | None = None) -> tuple[Column, ...]:
    return tuple(Column(h, group) for h in headers)
