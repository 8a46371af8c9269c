"""Drive the `quantstudy` command as a user would: a subprocess, real files, its exit status."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MODEL = "test_efficientnet"  # timm's tiny CI model (160x160 input), random weights
WNIDS = ("n01440764", "n01443537")  # ImageNet classes 0 and 1
# `quantstudy run` exit statuses of a finished study: 0 ship, 3 not ship, 4 inconclusive
# (`quantstudy run --help`); a study without GPU timings never ships.
FINISHED = frozenset({0, 3, 4})
ERROR = "quantstudy: error:"


def quantstudy_command() -> list[str]:
    """The installed console script beside this Python, else the module."""
    script = Path(sys.executable).parent / "quantstudy"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "quantstudy.cli"]


def study_args(out: Path | str, *extra: str) -> list[str]:
    """`run` of the tiny study every case shares (paths relative to the workspace)."""
    return [
        "run",
        MODEL,
        "--weights",
        "random",
        "--device",
        "cpu",
        "--no-speed",
        "--calib",
        "4",
        "--heldout",
        "20",
        "--class-list",
        "classes.txt",
        "--data",
        "data",
        "--out",
        str(out),
        *extra,
    ]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) | (extra or {})
    env["COLUMNS"] = "250"  # rich wraps at 80 columns when not on a terminal
    # this test process's share of the cores (tests/conftest.py: one thread under two pytest-xdist
    # workers): a child with more threads than its share spins against the others' (two studies
    # side by side took more than twice as long at 2 threads each as at 1 on 2 cores)
    env.setdefault("OMP_NUM_THREADS", str(_threads()))
    return env


def _threads() -> int:
    import torch  # already imported by tests/conftest.py, which set its count

    return torch.get_num_threads()


def umask_022() -> None:
    """The child's umask, and SIGINT's default handling: a shell's background job (pytest run
    with `&`) passes SIGINT ignored on, and the Ctrl-C tests would then test nothing."""
    os.umask(0o022)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def quantstudy(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    preexec: Callable[[], None] | None = umask_022,
    env: dict[str, str] | None = None,
) -> Result:
    """Run `quantstudy ARGS` in `cwd` and wait for it (`env`: variables set for it)."""
    p = subprocess.run(
        [*quantstudy_command(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(env),
        preexec_fn=preexec,
    )
    return Result(p.returncode, p.stdout, p.stderr)


def quantstudy_into_closed_pipe(*args: str, cwd: Path, stderr_too: bool = False) -> Result:
    """`quantstudy ARGS | head -1` once head has exited: stdout (and with `stderr_too`, stderr:
    `2>&1 | head -1`) is a pipe whose reader is gone, so every write to it fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run(
            [*quantstudy_command(), *args],
            cwd=cwd,
            stdout=write,
            stderr=write if stderr_too else subprocess.PIPE,
            text=True,
            timeout=300,
            env=_env(),
            preexec_fn=umask_022,
        )
    finally:
        os.close(write)
    return Result(p.returncode, "", p.stderr or "")


def start(*args: str, cwd: Path) -> subprocess.Popen:
    """Start `quantstudy ARGS` in `cwd` without waiting."""
    return subprocess.Popen(
        [*quantstudy_command(), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=umask_022,
    )


def assert_one_line_error(r: Result, *needles: str, code: int = 1) -> str:
    """The command failed with `code` and said why in exactly one line, its last, no traceback."""
    assert r.code == code, f"exit {r.code}, expected {code}\n{r.text[-3000:]}"
    assert "Traceback" not in r.text, r.text[-3000:]
    errors = [line for line in r.err.splitlines() if line.startswith(ERROR)]
    assert len(errors) == 1, r.err[-3000:]
    assert r.err.rstrip("\n").splitlines()[-1] == errors[0], r.err[-3000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


def assert_usage_error(r: Result, command: str, *needles: str) -> str:
    """argparse refused the command line: exit 2, its usage block, then exactly one error line
    (`quantstudy COMMAND: error: ...`), the last; nothing else on stderr, no traceback."""
    assert r.code == 2, f"exit {r.code}, expected 2\n{r.text[-3000:]}"
    assert "Traceback" not in r.text, r.text[-3000:]
    lines = r.err.rstrip("\n").splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], r.err[-3000:]
    assert errors[0].startswith(f"quantstudy {command}: error: "), errors[0]
    usage = lines[:-1]
    assert usage and usage[0].startswith("usage: quantstudy"), r.err[-3000:]
    assert all(line.startswith(" ") for line in usage[1:]), r.err[-3000:]  # usage continues
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


def assert_finished(r: Result) -> None:
    assert r.code in FINISHED, f"exit {r.code}\n{r.text[-3000:]}"
    assert "Traceback" not in r.text


def files_under(folder: Path) -> set[str]:
    """Every file below `folder`, as paths relative to it."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def snapshot(folder: Path) -> dict[str, bytes]:
    """Content of every file below `folder` except the lock (which names its last holder)."""
    return {
        name: (folder / name).read_bytes()
        for name in sorted(files_under(folder))
        if not name.endswith(".lock")
    }


def leftover_tmp(folder: Path) -> list[str]:
    return sorted(name for name in files_under(folder) if name.endswith(".tmp"))


def copy_study(study: Path, to: Path) -> Path:
    shutil.copytree(study, to)
    return to


# The sections of a record that hold what a study measured and decided; the others say where and
# when it ran (environment, timings, config.out) or seal it (digest).
MEASURED = (
    "model",
    "preprocessing",
    "data",
    "recipe",
    "calibration",
    "engines",
    "quality",
    "speed",
    "decision",
)


def measured(folder: Path) -> dict:
    """The measured sections of the study in `folder`: a resumed study must equal one that ran
    without a break, number for number."""
    import json

    record = json.loads((Path(folder) / "study.json").read_text())
    return {key: record.get(key) for key in MEASURED}
