"""Internal errors are not user errors: a bug's traceback goes to a log file, the console gets one
line naming it, and the exit status is 5 (1 stays a user error); a reader that closes stdout
ends a command quietly with 141, without a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from quantstudy import cli
from quantstudy.cli_crash import LOG_PREFIX, output_folder
from quantstudy.record.errors import EXIT_INTERNAL, EXIT_PIPE, UserError

REPO = Path(__file__).resolve().parents[2]


def _child_env() -> dict[str, str]:
    """This checkout's sources first, the rest of PYTHONPATH kept: the GPU machine installs the
    wheels its image lacks (pydantic) into a folder on PYTHONPATH, and a child without it cannot
    import quantstudy (it exited 1 there before the pipe was written)."""
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _boom(_args: argparse.Namespace) -> int:
    raise RuntimeError("an invariant broke\nsecond line of the message")


def _refuse(_args: argparse.Namespace) -> int:
    raise UserError("bad input; fix it")


def _stand_in(
    monkeypatch: pytest.MonkeyPatch, name: str, run: Callable[[argparse.Namespace], int]
) -> None:
    """The registry's command `name` running `run` (its arguments and checks unchanged)."""
    monkeypatch.setitem(cli.REGISTRY, name, dataclasses.replace(cli.REGISTRY[name], run=run))


def _one_log(folder: Path) -> Path:
    logs = sorted(folder.glob(f"{LOG_PREFIX}*.log"))
    assert len(logs) == 1, logs
    return logs[0]


def test_internal_error_logs_to_the_output_folder(monkeypatch, tmp_path, capsys) -> None:
    _stand_in(monkeypatch, "report", _boom)
    study = tmp_path / "study"
    status = cli.main(["report", str(study)])
    assert status == EXIT_INTERNAL == 5
    log = _one_log(study)
    text = log.read_text()
    assert (
        "Traceback (most recent call last)" in text and "RuntimeError: an invariant broke" in text
    )
    assert f"command: quantstudy report {study}" in text and "versions: python" in text
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, the message's first line, and the log's path
    assert str(log) in err[0] and "internal error" in err[0] and "second line" not in err[0]


def test_internal_error_without_an_output_folder_goes_to_the_state_folder(
    monkeypatch, tmp_path, capsys
) -> None:
    _stand_in(monkeypatch, "recipes", _boom)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert cli.main(["recipes"]) == EXIT_INTERNAL
    log = _one_log(tmp_path / "state" / "quantstudy" / "crashes")
    assert str(log) in capsys.readouterr().err


def test_an_unwritable_output_folder_falls_back(monkeypatch, tmp_path, capsys) -> None:
    _stand_in(monkeypatch, "report", _boom)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["report", str(blocker / "study")]) == EXIT_INTERNAL
    assert str(_one_log(tmp_path / "state" / "quantstudy" / "crashes")) in capsys.readouterr().err


def test_a_user_error_stays_exit_one_without_a_log(monkeypatch, tmp_path, capsys) -> None:
    _stand_in(monkeypatch, "report", _refuse)
    assert cli.main(["report", str(tmp_path)]) == 1
    assert not list(tmp_path.glob(f"{LOG_PREFIX}*"))
    assert capsys.readouterr().err.strip() == "quantstudy: error: bad input; fix it"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "timm/resnet18.a1_in1k", "--data", "d"], Path("studies/timm_resnet18.a1_in1k")),
        (["run", "resnet18", "--data", "d", "--out", "here"], Path("here")),
        (["demo"], Path("studies/tf_efficientnet_lite0")),
        (["decide", "s"], Path("s")),
        (["sweep", "grids/x.yaml"], Path("sweeps/x")),
        (["recipes"], None),
    ],
)
def test_output_folder_of_each_kind_of_command(argv: list[str], expected: Path | None) -> None:
    args, _ = cli._parser().parse_known_args(argv)
    assert output_folder(args) == expected


def test_a_closed_stdout_ends_quietly_with_141() -> None:
    """The reader is gone before the command writes (`| head` that has read enough): no
    BrokenPipeError traceback, neither from the command nor from the interpreter's last flush."""
    env = _child_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantstudy.cli", "recipes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the read end closes before the child prints anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_PIPE == 141
    assert err == "", err


def test_a_reader_that_goes_away_ends_the_output_not_the_work(tmp_path) -> None:
    """Guarded streams (`ReaderGuard`): writes past the closed pipe, on stdout and on stderr
    (through print and rich's console alike), go nowhere; the work after them is done; the
    status is 141. Unguarded, rich's console exits 1 at its first write."""
    script = (
        "import sys\n"
        "from rich.console import Console\n"
        "from quantstudy.cli_crash import after_readers, guard_readers\n"
        "guard_readers()\n"
        "for _ in range(2000):\n"
        "    print('x' * 80)\n"
        "    Console(stderr=True).print('y' * 80)\n"
        f"open({str(tmp_path / 'done')!r}, 'w').write('the work after the writes')\n"
        "sys.exit(after_readers(0))\n"
    )
    read, write = os.pipe()
    os.close(read)
    env = _child_env()
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], stdout=write, stderr=write, env=env, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == EXIT_PIPE
    assert (tmp_path / "done").read_text() == "the work after the writes"
