"""`quantstudy bench peers`: from the parsed options to the rows' study configs and the record."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from quantstudy.bench.peers.alike import read_rows, row_config
from quantstudy.bench.peers.run import bench_peers
from quantstudy.bench.schema import PeersBench
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError


def run_peers(
    args: argparse.Namespace, study_config: Callable[[], StudyConfig], argv: list[str]
) -> PeersBench:
    """The record of MODEL, or of every row of `--rows` (the command's options apply to each;
    a row's recipe and weights win)."""
    if (args.model is None) == (args.rows is None):
        raise UserError("give a MODEL or --rows FILE (one of the two)")
    if args.rows is None:
        configs = [study_config()]
    else:
        rows = read_rows(args.rows)
        args.model = rows[0].name  # the command's options, validated once with a real model
        base = study_config()
        configs = [row_config(base, row) for row in rows]
    return bench_peers(
        configs, args.torchao, rounds=args.rounds, iters=args.iters, out=args.record,
        append=args.append, max_rows=args.max_rows, argv=argv, ours=args.ours,
    )  # fmt: skip
