"""The `zoo` subcommand: its arguments, each choice list taken from the type it fills."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from quantstudy.cli_base.command import Command, command_line, positive
from quantstudy.record.errors import UserError
from quantstudy.study.cli_options import add_config_args
from quantstudy.sweep.events import ExecutorKind, Transfer
from quantstudy.zoo.catalogue import WeightsMode, parse_shard
from quantstudy.zoo.points import ZOO_DEFAULTS, ZOO_STUDY_OPTIONS, ZooOptions


def _arguments(zoo: argparse.ArgumentParser) -> None:
    """`quantstudy zoo --data DIR`: one speed study per model of a list, and the leaderboard."""
    zoo.add_argument(
        "--data",
        type=Path,
        help="images to calibrate and time on (required, except to write the page from --rows)",
    )
    zoo.add_argument("--models", type=Path, help="zoo list YAML (default: the committed list)")
    zoo.add_argument(
        "--shard",
        default="1/1",
        help="run the I-th of N parts of the list (every N-th model from the I-th), e.g. 2/4; "
        "the leaderboard covers every model --out holds (default 1/1: all)",
    )
    zoo.add_argument(
        "--weights",
        choices=get_args(WeightsMode),
        default="random",
        help="random (default): every study speed only; cache: real weights where present (a "
        "list entry's own, else the local timm cache), with quality and a decision; random and "
        "speed only for the others",
    )
    zoo.add_argument("--out", type=Path, default=Path("zoo"), help="zoo folder (default zoo/)")
    zoo.add_argument("--executor", choices=get_args(ExecutorKind), default="local")
    zoo.add_argument("--address", help="Ray cluster address (default: start a local one)")
    zoo.add_argument("--workers", type=positive, help="GPUs to use (default: every visible one)")
    zoo.add_argument(
        "--jobs",
        type=positive,
        help="studies sharing each GPU: their compiles and tile tuning overlap, every timing "
        "holds the GPU alone behind a lock file in --out (default: a study per 4 cores, at "
        "most 4, on a GPU; 1 on the CPU)",
    )
    zoo.add_argument(
        "--rows",
        type=Path,
        help="the committed rows, one JSON per model (e.g. docs/results/zoo): fresh ones are "
        "kept, missing and stale ones measured and written there (docs/zoo.md)",
    )
    zoo.add_argument(
        "--page",
        type=Path,
        help="also write the leaderboard page here, its plot beside it; without --data: "
        "render it from --rows alone, running nothing",
    )
    zoo.add_argument(
        "--check-alone",
        action="append",
        default=[],
        metavar="MODEL",
        help="after the run, time MODEL again with no other study on the GPU and say whether "
        "its x agrees with its row's (repeatable; writes alone-check.json in --out)",
    )
    zoo.add_argument("--transfer", choices=get_args(Transfer), default="auto")
    # every other study option, as `quantstudy run` takes it, with the zoo's own defaults
    add_config_args(zoo, ZOO_STUDY_OPTIONS, defaults=ZOO_DEFAULTS)
    zoo.add_argument("--dry-run", action="store_true", help="print the shard and stop")
    zoo.add_argument(
        "--leaderboard-only",
        action="store_true",
        help="run nothing: write the leaderboard from the studies --out holds",
    )


def _run(args: argparse.Namespace) -> int:
    """Run `quantstudy zoo` with the parsed `args`; its command line is recorded as provenance."""
    from quantstudy.zoo.run import run_zoo, write_board

    if args.data is None and (args.rows is None or args.page is None):
        raise UserError("zoo needs --data DIR to run studies, or --rows DIR and --page FILE "
                        "to write the leaderboard page from the committed rows")  # fmt: skip
    if args.page is not None and args.page.exists() and not args.page.is_file():
        raise UserError(f"--page {args.page} is not a file; name the Markdown page to write")
    options = zoo_options(args)
    return write_board(options) if args.data is None else run_zoo(options)


def zoo_options(args: argparse.Namespace) -> ZooOptions:
    """The zoo's options from its parsed `args`: every study option given (`ZOO_STUDY_OPTIONS`)
    goes to the studies as it is."""
    return ZooOptions(
        data=args.data or Path("."),
        out=args.out,
        models=args.models,
        shard=parse_shard(args.shard),
        weights=args.weights,
        study={n: v for n in ZOO_STUDY_OPTIONS if (v := getattr(args, n)) is not None},
        executor=args.executor,
        address=args.address,
        transfer=args.transfer,
        workers=args.workers,
        jobs=args.jobs,
        rows=args.rows,
        page=args.page,
        check_alone=tuple(args.check_alone),
        dry_run=args.dry_run,
        run=not args.leaderboard_only,
        command=("quantstudy", *command_line(args)),
    )


ZOO = Command(
    "time fp16 against FP8 for every model of a list (default: the committed timm "
    "zoo), in shards, resumable, and write the leaderboard (CSV, JSON, Markdown, plot)",
    _arguments,
    _run,
    "exit status: 0 every model of the shard finished, 1 one or more failed (see "
    "zoo.md), 130 stopped (rerun to resume); docs/zoo.md",
)
