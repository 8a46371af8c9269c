"""The zoo page's self-check: no row shows a gain its own rounds do not support.

The study report's rule (`report/selfcheck_x.py`) on the leaderboard's table, against the rows
the page was rendered from: a row whose x at a batch is not settled ([q1, q3] contains 1.0, or
the row's kept warnings say so) shows that x marked "not settled", no fraction of the ideal for
it, sits below every settled row at the largest batch (not ranked), and is in no family's
median: each family the family line names counts exactly its settled rows, at their median.
"""

from __future__ import annotations

import math
import re
import statistics

from quantstudy.report.selfcheck_x import Unsettled, unsettled_shown, unsupported
from quantstudy.zoo.board import Leaderboard, ZooRow

FAMILY_LINE = re.compile(r"^Median x at batch (\d+) per family")
FAMILY = re.compile(r"([\w.-]+) \(([\d.]+), (\d+) models?\)")


def x_column(batch: int) -> str:
    return f"x @{batch} [q1, q3]"


def ideal_column(batch: int) -> str:
    return f"of ideal x @{batch}"


def _unsupported(row: ZooRow, batch: int) -> bool:
    at = row.at(batch)
    return at is not None and unsupported(at.claim(), at.warnings or [])


def _has_ideal(row: ZooRow, batch: int) -> bool:
    """The row has an ideal x at `batch` to take a fraction of (`XClaim.ideal`)."""
    at = row.at(batch)
    ideal = None if at is None else at.ideal_x
    return ideal is not None and math.isfinite(ideal) and ideal > 0


def check_page(md: str, board: Leaderboard) -> list[str]:
    """Problems of a rendered zoo page against its board; an empty list means it passes."""
    last = max(board.batches, default=None)
    if last is None:
        return []
    cells = []
    for r in board.rows:
        for b in board.batches:
            if _unsupported(r, b):
                cells.append(Unsettled("model", r.model, x_column(b)))
                # without an ideal (the CPU, an unknown GPU) the cell is "-": nothing claimed
                if b == last and _has_ideal(r, b):
                    cells.append(Unsettled("model", r.model, ideal_column(last)))
    problems = unsettled_shown(md, cells, "the zoo page")
    return problems + _ranking(md, board, last) + _families(md, board)


def _ranking(md: str, board: Leaderboard, last: int) -> list[str]:
    """A row whose x at the largest batch is not settled comes after every settled one."""
    by_model = {r.model: r for r in board.rows}
    order = [
        line.split("|")[1].strip()
        for line in md.split("\n")
        if line.startswith("| ") and line.split("|")[1].strip() in by_model
    ]
    settled = [m for m in order if by_model[m].at(last) is not None]
    settled = [m for m in settled if not _unsupported(by_model[m], last)]
    if not settled:
        return []
    last_settled = order.index(settled[-1])
    return [
        f"the zoo page ranks {m} (x at batch {last} not settled) above a settled row"
        for m in order[:last_settled]
        if by_model[m].at(last) is not None and _unsupported(by_model[m], last)
    ]


def _families(md: str, board: Leaderboard) -> list[str]:
    """Each family the family line names: its settled rows' count and median, no other."""
    problems = []
    for line in md.split("\n"):
        head = FAMILY_LINE.match(line)
        if head is None:
            continue
        batch = int(head.group(1))
        for family, median, n in FAMILY.findall(line.split(":", 1)[1]):
            xs = [
                at.x
                for r in board.rows
                if r.family == family and (at := r.at(batch)) is not None
                if not _unsupported(r, batch)
            ]
            if len(xs) != int(n) or f"{statistics.median(xs) if xs else 0.0:.2f}" != median:
                problems.append(
                    f"the zoo page's family line gives {family} ({median}, {n}), but its rows "
                    f"whose x at batch {batch} is settled are {len(xs)}"
                )
    return problems
