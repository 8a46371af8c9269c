"""`quantstudy sweep FILE`: a grid of studies, local or on Ray."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantstudy.cli_base.command import Command
from quantstudy.record.errors import EXIT_COMMON, UserError


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_file", type=Path, help="sweep YAML (see quantstudy/sweep/spec.py)")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument("--address", help="Ray cluster address (default: start a local one)")
    p.add_argument("--out", type=Path, help="sweep folder (default sweeps/<file stem>/)")
    p.add_argument(
        "--workers",
        type=int,
        help="parallel studies (default: one per visible GPU, or one per CPU core)",
    )
    p.add_argument(
        "--transfer",
        choices=["auto", "shared", "copy"],
        default="auto",
        help="ray: how study folders reach --out (default auto: shared when the workers see "
        "--out, else copied back as bytes)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the grid and stop")


def _run(args: argparse.Namespace) -> int:
    from quantstudy.sweep.run import SweepOptions, run_sweep

    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    out = args.out or Path("sweeps") / args.sweep_file.stem
    options = SweepOptions(
        args.sweep_file, out, args.executor, args.address, args.workers, args.transfer, args.dry_run
    )
    return run_sweep(options)


SWEEP = Command(
    "run a grid of studies (models x recipes x calibrators x seeds x FP8 kernels)",
    _arguments,
    _run,
    "exit status: 0 every study finished, 1 one or more failed (see sweep.md) or a "
    f"user error, 130 stopped (rerun to resume); {EXIT_COMMON}",
)
