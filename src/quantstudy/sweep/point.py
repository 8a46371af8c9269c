"""Run one grid point as its own `quantstudy run --config` subprocess, and record how it went.

A point's folder holds the study (study.json, report.md, .cache), `study-config.json` (the
`StudyConfig` the study runs, written by pydantic and read back by the same model), `run.log`
(the subprocess's stdout and stderr) and `point.json` (`PointStatus`: settings, command, status,
error, wall time). One subprocess per point: a crash or an out-of-memory kill takes down that
study only.

On a stop request (Ctrl-C) the subprocess gets SIGINT, then SIGKILL after a grace period; the
study's own record and stage cache are written atomically after every stage, so the next run
resumes it from its last finished stage.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from quantstudy.record.base import Section
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic, write_text_atomic
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.readers import read_json
from quantstudy.study.commands import STOP_ON_SIGINT
from quantstudy.sweep.grid import GridPoint

POINT_FILE = "point.json"
LOG_FILE = "run.log"
CONFIG_FILE = "study-config.json"
STOP_GRACE_S = 20.0  # after SIGINT, time a study gets to finish writing before SIGKILL
ERROR_PREFIX = "quantstudy: error: "  # how the CLI prints a user mistake (cli.py)

Status = Literal["running", "complete", "failed", "interrupted"]


class PointStatus(Section):
    """`point.json`: one grid point's settings and the outcome of its last attempt."""

    folder: str  # name of the point's folder inside the sweep's --out
    settings: GridPoint
    argv: list[str]
    status: Status
    attempts: int  # runs of this point so far, this one included
    returncode: int | None = None
    error: str | None = None  # the study's one-line error, or the last line of its traceback
    wall_s: float | None = None
    host: str
    started_utc: str
    finished_utc: str | None = None


def read_status(folder: Path) -> PointStatus | None:
    path = folder / POINT_FILE
    if not path.is_file():
        return None
    data = read_json(path, "sweep point status", "record")
    try:
        return PointStatus.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(
            f"{path} is not a sweep point status ({where}: {first['msg']}); remove the point's "
            "folder to run it again"
        ) from None


def _study_complete(folder: Path) -> bool:
    """The point's study record reads (`record/load.py`) and says complete; a record this
    quantstudy cannot read is not a finished point (the summary's row says why)."""
    study = folder / RECORD_FILE
    if not study.is_file():
        return False
    try:
        return load_record(study).status == "complete"
    except UserError:
        return False


def is_finished(folder: Path) -> bool:
    """The point completed and its study record says complete: a rerun skips it."""
    status = read_status(folder)
    return status is not None and status.status == "complete" and _study_complete(folder)


def run_point(
    point: GridPoint,
    folder: Path,
    env: dict[str, str],
    stop: threading.Event,
    label: str | None = None,
) -> PointStatus:
    """Run `point` into `folder` (created), writing point.json before and after."""
    folder.mkdir(parents=True, exist_ok=True)
    previous = read_status(folder)
    started = time.perf_counter()
    status = PointStatus(
        folder=label or folder.name,
        settings=point,
        argv=[],
        status="running",
        attempts=(previous.attempts if previous else 0) + 1,
        host=socket.gethostname(),
        started_utc=_now(),
    )
    try:
        config = point.study_config(folder)
    except UserError as err:  # the sweep's recipe cannot be derived: this point fails alone
        (folder / LOG_FILE).write_text(f"{ERROR_PREFIX}{err}\n", encoding="utf-8")
        return _finish(folder, status, "failed", None, str(err), started)
    write_text_atomic(folder / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
    argv = study_command(CONFIG_FILE)
    status = status.model_copy(update={"argv": argv})
    _write(folder, status)
    with open(folder / LOG_FILE, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            env=_child_env(env),
            start_new_session=True,  # the sweep, not the terminal, decides when a study stops
        )
        code = _wait(proc, stop)
    if _study_complete(folder):  # the exit status is the decision's outcome (0, 3 or 4)
        return _finish(folder, status, "complete", code, None, started)
    if stop.is_set():
        return _finish(folder, status, "interrupted", code, "stopped by the sweep", started)
    return _finish(folder, status, "failed", code, _error_line(folder / LOG_FILE), started)


def study_command(config_file: str) -> list[str]:
    """The command that runs the study of `config_file` (relative to its working directory)."""
    return [sys.executable, "-m", "quantstudy.cli", "run", "--config", config_file]


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment with `extra` and `STOP_ON_SIGINT`; PYTHONPATH made absolute
    (the study's working directory is its folder)."""
    env = {**os.environ, **extra, STOP_ON_SIGINT: "1"}
    if env.get("PYTHONPATH"):
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in parts if p)
    return env


def record_failure(folder: Path, point: GridPoint, error: str) -> PointStatus:
    """Record a point that failed outside its study (e.g. its Ray worker was lost)."""
    folder.mkdir(parents=True, exist_ok=True)
    previous = read_status(folder)
    status = PointStatus(
        folder=folder.name,
        settings=point,
        argv=previous.argv if previous else [],
        status="failed",
        attempts=previous.attempts if previous else 1,
        error=error,
        host=socket.gethostname(),
        started_utc=previous.started_utc if previous else _now(),
        finished_utc=_now(),
    )
    _write(folder, status)
    return status


def _wait(proc: subprocess.Popen[bytes], stop: threading.Event) -> int:
    """Wait for the study; on a stop request send SIGINT, then SIGKILL after the grace period."""
    try:
        while True:
            try:
                return proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                if stop.is_set():
                    break
    except KeyboardInterrupt:  # Ray delivers a task cancel as KeyboardInterrupt
        stop.set()
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def _error_line(log: Path) -> str:
    """The CLI's one-line user error if there is one, else the traceback's exception line,
    else the last line of the log."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    lines = [ln.rstrip() for ln in lines if ln.strip()]
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line.removeprefix(ERROR_PREFIX)
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1].strip() if lines else "the study exited without output"


def _finish(
    folder: Path,
    status: PointStatus,
    outcome: Status,
    code: int | None,
    error: str | None,
    started: float,
) -> PointStatus:
    done = status.model_copy(
        update={
            "status": outcome,
            "returncode": code,
            "error": error,
            "wall_s": round(time.perf_counter() - started, 2),
            "finished_utc": _now(),
        }
    )
    _write(folder, done)
    return done


def _write(folder: Path, status: PointStatus) -> None:
    write_json_atomic(folder / POINT_FILE, status.model_dump(mode="json"))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
