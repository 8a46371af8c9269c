"""The argparse parsers of the longer subcommands (search, sweep, extend), kept beside `cli.py`
so that the main parser reads as a list of subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from quantstudy.record.errors import EXIT_COMMON


def add_search_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_study_args: Callable[[argparse.ArgumentParser], None],
) -> None:
    """`quantstudy search MODEL`: the study's own options plus the search's."""
    search = sub.add_parser(
        "search", help="find the subset of a candidate recipe that pays under the quality budget"
    )
    search.add_argument("model")
    add_study_args(search)
    search.add_argument(
        "--gains", type=Path, help="per-layer gains JSON (default: measure them on CUDA)"
    )
    search.add_argument(
        "--batch",
        type=int,
        help="batch of the gains and the prediction (default: largest --batches)",
    )
    search.add_argument(
        "--sensitivity-images",
        type=int,
        default=256,
        help="held-out images scored per layer (default 256)",
    )
    search.add_argument(
        "--all-but", action="store_true", help="also score the recipe with each layer left out"
    )
    search.add_argument(
        "--no-options",
        action="store_true",
        help="search the layer subset only, under the recipe's own FP8 quality options (skips "
        "trying compensating rounding, per-layer calibrators, migration and the sequential fit "
        "first)",
    )
    search.add_argument(
        "--margin",
        type=float,
        default=0.5,
        help="share of the policy's quality budget the search may spend",
    )


def add_sweep_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`quantstudy sweep FILE`: a grid of studies, local or on Ray."""
    sweep = sub.add_parser(
        "sweep",
        help="run a grid of studies (models x recipes x calibrators x seeds x FP8 kernels)",
        epilog="exit status: 0 every study finished, 1 one or more failed (see sweep.md) or a "
        f"user error, 130 stopped (rerun to resume); {EXIT_COMMON}",
    )
    sweep.add_argument("sweep_file", type=Path, help="sweep YAML (see quantstudy/sweep/spec.py)")
    sweep.add_argument("--executor", choices=["local", "ray"], default="local")
    sweep.add_argument("--address", help="Ray cluster address (default: start a local one)")
    sweep.add_argument("--out", type=Path, help="sweep folder (default sweeps/<file stem>/)")
    sweep.add_argument(
        "--workers",
        type=int,
        help="parallel studies (default: one per visible GPU, or one per CPU core)",
    )
    sweep.add_argument(
        "--transfer",
        choices=["auto", "shared", "copy"],
        default="auto",
        help="ray: how study folders reach --out (default auto: shared when the workers see "
        "--out, else copied back as bytes)",
    )
    sweep.add_argument("--dry-run", action="store_true", help="print the grid and stop")


def add_extend_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], exit_status: str
) -> None:
    """`quantstudy extend DIR --data MORE`: more held-out images for a finished study."""
    extend = sub.add_parser(
        "extend",
        help="add held-out images from another folder to a finished study, in rounds until "
        "its quality gates settle, and decide again",
        epilog=exit_status,
    )
    extend.add_argument("study_dir", type=Path)
    extend.add_argument("--data", type=Path, required=True, help="folder of more images")
    extend.add_argument(
        "--skip-used",
        action="store_true",
        help="leave out images the study already used instead of refusing the folder",
    )
