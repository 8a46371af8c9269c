"""One `quantstudy` subcommand as the registry in `cli.py` holds it.

Each package's `commands.py` declares its `Command`s (help, arguments, run); `cli.py` lists
them, builds one parser from them and runs the chosen one. The argparse types below are those
several commands' options share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One `quantstudy NAME` subcommand. `arguments` only adds argparse arguments (building the
    parser imports no torch); `run` imports what it runs and returns the exit status (None: 0);
    `check` names a usage mistake argparse cannot see (`run` without MODEL), or None."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    epilog: str | None = None
    check: Callable[[argparse.Namespace], str | None] | None = None


def command_line(args: argparse.Namespace) -> list[str]:
    """The command line (after `quantstudy`) a command's records name: `main`'s argv, else this
    process's."""
    argv: list[str] | None = args.argv
    return sys.argv[1:] if argv is None else argv


def batches(text: str) -> tuple[int, ...]:
    """The argparse type of every `--batches`: comma-separated batch sizes."""
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"batches must look like 1,32,128, not '{text}'") from None


def positive(text: str) -> int:
    """The argparse type of a count that must be at least 1 (`--jobs`, `--workers`): 0 or a
    negative number is refused as the usage error it is, never read as "the default"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
