"""The `quantstudy` command: a thin argparse layer over the library.

Every subcommand is one `Command` (`cli_base/command.py`) in `REGISTRY`, declared in the
`commands.py` of the package that does its work (the benches in `bench/cli.py`); this module
builds the parser from that table and runs the chosen command.

User mistakes (`UserError`) and filesystem faults (a full disk, a read-only --out) print one clean
line and exit 1; Ctrl-C prints one line and exits 130; a reader that closes stdout (`| head`)
ends the command quietly with 141; anything else is a bug: its traceback goes to a log file,
the console gets one line with its path, and the exit status is 5 (`cli_crash.py`).
"""

from __future__ import annotations

import argparse
import sys

from quantstudy.bench.cli import BENCH
from quantstudy.bridge.commands import EXPORT, IMPORT_TRT
from quantstudy.cli_base.command import Command
from quantstudy.cli_crash import after_readers, guard_readers, reader_gone, report_crash
from quantstudy.package.commands import PACKAGE
from quantstudy.quant.kernels.switches import check_lab_switches
from quantstudy.record.errors import EXIT_INTERRUPTED, EXIT_USER, UserError
from quantstudy.record.io import filesystem_message
from quantstudy.search.commands import SEARCH
from quantstudy.study.commands import DECIDE, DEMO, EXTEND, RECIPES, REPORT, RUN
from quantstudy.sweep.commands import SWEEP
from quantstudy.zoo.commands import ZOO

__all__ = ["REGISTRY", "main"]

# Every subcommand, in the order `quantstudy --help` lists them.
REGISTRY: dict[str, Command] = {
    "run": RUN,
    "demo": DEMO,
    "recipes": RECIPES,
    "search": SEARCH,
    "report": REPORT,
    "sweep": SWEEP,
    "zoo": ZOO,
    "decide": DECIDE,
    "extend": EXTEND,
    "export": EXPORT,
    "import-trt": IMPORT_TRT,
    "bench": BENCH,
    "package": PACKAGE,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantstudy",
        description="Does FP8 post-training quantization pay for this timm classifier?",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in REGISTRY.items():
        command.arguments(sub.add_parser(name, help=command.help, epilog=command.epilog))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = REGISTRY[args.command]
    check = command.check
    problem = None if check is None else check(args)
    if problem is not None:
        parser.error(problem)
    args.argv = argv  # the command line a record names (None: this process's)
    guard_readers()  # a reader that goes away (`| head`) ends the output, not the work
    try:
        check_lab_switches()  # a junk value refused before any work, on the CPU too
        status = command.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit after the last print
    except UserError as e:
        print(f"quantstudy: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("\nquantstudy: interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except OSError as e:
        # a full disk, a read-only folder, a cache folder in /proc: one line, not a bug
        message = filesystem_message(e, verb="use")
        if message is None:
            return report_crash(e, args, sys.argv[1:] if argv is None else argv)
        print(f"quantstudy: error: {message}", file=sys.stderr)
        return EXIT_USER
    except Exception as e:  # a bug: its traceback to a log file, one line here (cli_crash.py)
        return report_crash(e, args, sys.argv[1:] if argv is None else argv)
    return after_readers(status or 0)  # run, decide, sweep, ...: their exit status


if __name__ == "__main__":
    sys.exit(main())
