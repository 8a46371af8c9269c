"""Internal errors: a bug in quantstudy is not the user's mistake, and is said apart from one.

A `UserError` prints one line and exits 1. Any other exception that reaches the command is a
bug (or a library fault quantstudy did not anticipate): its traceback goes to a log file, with
the command line and the versions that ran it, and the console gets one line naming that file;
the exit status is `EXIT_INTERNAL` (5), so a script tells a crash from a refusal.

The log goes into the command's output folder, where the user looks for its results: `--out`
or the study folder a command reads (`report`, `decide`, `extend`, `export`, `package`), and
for `run`, `search` and `demo` without `--out` the model's folder under `studies/`, for `sweep`
its `sweeps/<name>/`. Commands without an output folder (`recipes`, `bench` without `--out`)
and a folder that cannot be written fall back to `$XDG_STATE_HOME/quantstudy/crashes` (by
default `~/.local/state/quantstudy/crashes`), then to the system's temporary folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from quantstudy.record.errors import EXIT_INTERNAL, EXIT_PIPE

LOG_PREFIX = "quantstudy-crash-"
DEMO_MODEL = "tf_efficientnet_lite0"


def state_folder() -> Path:
    """`$XDG_STATE_HOME/quantstudy/crashes`, the XDG place for an application's logs."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "quantstudy" / "crashes"


def output_folder(args: argparse.Namespace) -> Path | None:
    """The folder the command writes its results into, when it has one (module docstring)."""
    for attr in ("out", "study_dir"):
        value = getattr(args, attr, None)
        if value:
            return Path(value)
    command = getattr(args, "command", None)
    if command in ("run", "search") and getattr(args, "model", None):
        return Path("studies") / str(args.model).replace("/", "_")
    if command == "demo":
        return Path("studies") / DEMO_MODEL
    if command == "sweep" and getattr(args, "sweep_file", None):
        return Path("sweeps") / Path(args.sweep_file).stem
    return None


def _versions() -> str:
    """Python and, where this process imported them, torch, timm and Triton."""
    found = [f"python {platform.python_version()}"]
    for name in ("torch", "timm", "triton"):
        module = sys.modules.get(name)
        if module is not None:
            found.append(f"{name} {getattr(module, '__version__', '?')}")
    return ", ".join(found)


def _log_text(err: BaseException, argv: list[str]) -> str:
    when = datetime.now(UTC).isoformat(timespec="seconds")
    lines = [
        f"quantstudy internal error at {when} (UTC)",
        f"command: quantstudy {' '.join(argv)}",
        f"cwd: {Path.cwd()}",
        f"versions: {_versions()}",
        "",
        *traceback.format_exception(err),
    ]
    return "\n".join(line.rstrip("\n") for line in lines) + "\n"


def write_crash_log(err: BaseException, args: argparse.Namespace, argv: list[str]) -> Path | None:
    """Write the traceback of `err` to a new file in the first writable folder of: the command's
    output folder, the state folder, the temporary folder; its path, or None if none took it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{LOG_PREFIX}{stamp}-{os.getpid()}.log"
    text = _log_text(err, argv)
    folders = [output_folder(args), state_folder(), Path(tempfile.gettempdir())]
    for folder in folders:
        if folder is None:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            with open(path, "x", encoding="utf-8") as f:  # "x": never over another log
                f.write(text)
            return path
        except OSError:
            continue
    return None


def report_crash(err: BaseException, args: argparse.Namespace, argv: list[str]) -> int:
    """Log `err` (module docstring), print the one line, return `EXIT_INTERNAL`."""
    path = write_crash_log(err, args, argv)
    what = f"{type(err).__name__}: {err}".splitlines()[0]
    if path is None:  # nowhere to write: the traceback goes to the console after all
        traceback.print_exception(err, file=sys.stderr)
        where = "no folder could take the log, so the traceback is above"
    else:
        where = f"traceback in {path}"
    print(
        f"quantstudy: internal error (a bug in quantstudy, not in your input): {what}; {where}; "
        "please report it with that file",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def reader_gone() -> int:
    """The reader of stdout went away (`quantstudy recipes show --json | head`): stop quietly,
    with the status a shell gives a process that SIGPIPE ended, and point stdout at devnull so
    that the interpreter's last flush does not fail again."""
    _to_devnull(sys.stdout)
    return EXIT_PIPE


def _to_devnull(stream: TextIO) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class ReaderGuard:
    """stdout or stderr as a command writes to it: once its reader has gone (`quantstudy run
    ... | head -1`), what follows goes to devnull and the work goes on. Without it the first
    write after `head` exits fails: rich's console then exits with status 1 and a print raises,
    and a study ends partial in the middle of its work. `main` ends a command whose reader went
    away with `EXIT_PIPE` once its work is done (`readers_gone`)."""

    gone = False  # any guarded stream's reader, for the whole process

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()
            self._stream.flush()  # what the pipe did not take, now to devnull

    def _lost(self) -> None:
        ReaderGuard.gone = True
        _to_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...: the stream's
        return getattr(self._stream, name)


def guard_readers() -> None:
    """Guard stdout and stderr (`ReaderGuard`) for the rest of this process."""
    ReaderGuard.gone = False
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ReaderGuard):
            setattr(sys, name, ReaderGuard(stream))


def after_readers(status: int) -> int:
    """The exit status of a command that ended with `status`: `EXIT_PIPE` where its output lost
    its reader on the way, as a shell reports a writer SIGPIPE ended."""
    return EXIT_PIPE if ReaderGuard.gone else status
