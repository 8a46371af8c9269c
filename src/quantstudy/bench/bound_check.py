"""`quantstudy bench bound-check RECORD`: would a bound on the configs a product launch times
have kept the tile that won? Read from a `bench products` record that names each column's tuned
tile (`ProductRow.tiles`); no GPU needed.

For each matmul row and each of our autotuned columns, the configs `tiles.prune_gemm` keeps for
that launch are ranked as the bound ranks them (`tiles.bounded`, what `QUANTSTUDY_GEMM_CONFIGS`
applies), and the winner's rank is printed: a bound of N keeps every winner ranked N or better.
The launch's options are the column's (fp8-out and GELU columns are their own launches); the
descriptor paths are taken as allowed where K and N are multiples of 16 (the bench's operands
are dense, so their rows are 16-byte aligned exactly then). A winner the ranking does not hold
(another table, or a persistent tile under the default promotion) is said, not ranked.
Arguments parse without torch or Triton; running imports the kernel's config table.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantstudy.record.errors import UserError

if TYPE_CHECKING:
    from quantstudy.bench.schema import ProductsBench


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", type=Path, help="a bench products record")


def products_record(path: Path) -> ProductsBench:
    """The products record at `path`; any other file is a `UserError` naming it."""
    from quantstudy.bench.schema import ProductsBench, read_record

    record = read_record(path)
    if not isinstance(record, ProductsBench):
        raise UserError(f"{path} is a {record.kind} record, not a products record")
    return record


def winner_ranks(record: ProductsBench) -> list[tuple[str, str, int | None]]:
    """(row and column, winning tile, its rank under the bound's order; None: not in it)."""
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.quant.kernels.tiles import config_words, prune_gemm, ranked
    from quantstudy.record.build_spec import PROMOTE

    found = []
    for row in record.results:
        if row.kind != "matmul" or not row.tiles:
            continue
        aligned = int(row.k % 16 == 0 and row.n % 16 == 0)
        for column, tile in row.tiles.items():
            promote = 0 if row.k <= PROMOTE else row.promote_of(column)
            named = {"M": row.m, "N": row.n, "K": row.k, "PROMOTE": promote}
            named |= {"tma_loads_ok": aligned, "tma_store_ok": aligned}
            order = [config_words(c) for c in ranked(prune_gemm(FP8_GEMM.configs, named), named)]
            where = f"b{row.batch} {row.m}x{row.k}x{row.n} {column}"
            found.append((where, tile, order.index(tile) + 1 if tile in order else None))
    return found


def run(args: argparse.Namespace, _: Any = None) -> None:
    ranks = winner_ranks(products_record(args.record))
    if not ranks:
        raise UserError(f"{args.record} names no tuned tile (recorded before `ProductRow.tiles`)")
    for where, tile, rank in ranks:
        print(f"{rank if rank is not None else '-':>3}  {tile:<48} {where}")
    held = [r for _, _, r in ranks if r is not None]
    counts = Counter(held)
    print(f"{len(ranks)} winners, {len(ranks) - len(held)} outside the ranking; kept by a bound of")
    for bound in sorted({1, 2, 4, 6, 8, 12, *counts}):
        print(f"  {bound:>2}: {sum(r <= bound for r in held)} of {len(ranks)}")
