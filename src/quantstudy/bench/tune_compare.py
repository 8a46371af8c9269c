"""`quantstudy bench tune-compare A B`: two `bench products` records of the same products, tuned
two ways (a tuning change against its baseline: a config bound, the screen off and on): what
the change cost our products, and, from the runs' tuning logs, what it saved the cold tune.

Products: each of our autotuned columns (`ours` and its epilogue variants) that both records
timed, B's time over A's: the geometric mean, the spread, and the columns B lost most on, with
the tile each record tuned. Tuning: from each run's `$QUANTSTUDY_TUNE_LOG` (JSON lines of
`quant/kernels/tuning.py`), launches tuned, configs compiled, screened and timed at full length,
and the seconds of compiling and of timing, over all launches and over those both logs tuned
(a run cut by its budget tunes fewer). This is what docs/fp8-kernel.md quotes for "What a cold
tune costs". No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantstudy.bench.bound_check import products_record
from quantstudy.record.errors import UserError

if TYPE_CHECKING:
    from quantstudy.bench.schema import ProductsBench

Key = tuple[str, int, int, int, int]  # kind, batch, M, K, N


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=Path, help="the baseline products record")
    p.add_argument("b", type=Path, help="the products record tuned the other way")
    p.add_argument(
        "--logs", type=Path, nargs=2, metavar=("A_LOG", "B_LOG"),
        help="the runs' tuning logs ($QUANTSTUDY_TUNE_LOG), A's then B's",
    )  # fmt: skip
    p.add_argument("--worst", type=int, default=8, help="columns to list where B lost most")


def column_ratios(a: ProductsBench, b: ProductsBench) -> list[tuple[str, str, float, str, str]]:
    """(product, column, B us / A us, A's tile, B's tile) for each of our tuned columns both
    records timed, in A's order."""
    theirs: dict[Key, Any] = {(r.kind, r.batch, r.m, r.k, r.n): r for r in b.results}
    found = []
    for row in a.results:
        other = theirs.get((row.kind, row.batch, row.m, row.k, row.n))
        if other is None or not row.tiles or not other.tiles:  # untuned, or before tiles named
            continue
        for column, tile in row.tiles.items():
            if column in row.us and column in other.us and column in other.tiles:
                where = f"{row.kind} b{row.batch} {row.m}x{row.k}x{row.n}"
                ratio = other.us[column] / row.us[column]
                found.append((where, column, ratio, tile, other.tiles[column]))
    return found


def read_log(path: Path) -> list[dict[str, Any]]:
    """A tuning log's rows (one JSON object a line; a line cut by a killed run is skipped)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def launch_key(row: dict[str, Any]) -> str:
    """A logged launch without what its tuning measured: the same launch in either log."""
    measured = {"configs", "screened", "finalists", "failed", "threads", "compile_s", "tune_s"}
    return json.dumps({k: v for k, v in row.items() if k not in measured | {"best", "tile"}})


def tuning_totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Launches, configs compiled, screened and timed at full length, and seconds."""
    total: dict[str, float] = {"launches": len(rows)}
    for field in ("configs", "screened", "finalists", "compile_s", "tune_s"):
        total[field] = round(sum(float(r.get(field, 0) or 0) for r in rows), 3)
    return total


def run(args: argparse.Namespace, _: Any = None) -> None:
    if args.worst < 0:
        raise UserError(f"--worst must be at least 0, got {args.worst}")
    ratios = column_ratios(products_record(args.a), products_record(args.b))
    if not ratios:
        raise UserError("no tuned column of ours is in both records")
    values = [r for _, _, r, _, _ in ratios]
    geo = math.exp(statistics.fmean(math.log(v) for v in values))
    same = sum(ta == tb for *_, ta, tb in ratios)
    print(
        f"{len(ratios)} columns both timed: B/A time {geo:.3f} (geometric mean), "
        f"{min(values):.3f} to {max(values):.3f}; the same tile in {same}"
    )
    for where, column, ratio, ta, tb in sorted(ratios, key=lambda r: -r[2])[: args.worst]:
        print(f"  {ratio:.3f}  {where} {column}: {ta} -> {tb}")
    if args.logs:
        logs = [read_log(p) for p in args.logs]
        keys = [{launch_key(r) for r in log} for log in logs]
        both = keys[0] & keys[1]
        for name, log in zip(("A", "B"), logs, strict=True):
            every = tuning_totals(log)
            shared = tuning_totals([r for r in log if launch_key(r) in both])
            print(f"{name} tuning, all {_said(every)}; the {len(both)} both tuned {_said(shared)}")


def _said(total: dict[str, float]) -> str:
    return (
        f"{total['launches']:.0f} launches: {total['configs']:.0f} configs compiled, "
        f"{total['screened']:.0f} screened, {total['finalists']:.0f} timed in full; "
        f"compile {total['compile_s']:.1f} s, timing {total['tune_s']:.1f} s"
    )
