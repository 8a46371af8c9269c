"""Classes 1 and 3 across every command: each file a user names is refused unopened when it is
not a file (a named pipe would block the reader, and Ctrl-C with it), no value changes type, the
zoo's committed rows and page are never damaged by a mistake, and a folder two runs would share
is locked. Every case fails in one line before any study runs, most before torch is imported."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.reliability._drive import (
    MODEL,
    Result,
    assert_one_line_error,
    assert_usage_error,
    quantstudy,
    study_args,
)

ROWS = Path(__file__).resolve().parents[2] / "docs" / "results" / "zoo"
LISTED = f"models:\n  - {{name: {MODEL}, family: efficientnet}}\n"
PAGE = "the committed page\n"
ONE_POINT = f"models:\n  - {{name: {MODEL}}}\nrecipes: [default]\ndata: data\n"


def _pipe(folder: Path, name: str) -> str:
    os.mkfifo(folder / name)
    return str(folder / name)


def _file(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


def _run(folder: Path, *extra: str) -> list[str]:
    return study_args(folder / "out", *extra)


def _search(folder: Path, gains: str) -> list[str]:
    return ["search", *_run(folder)[1:], "--gains", gains]


def _zoo(folder: Path, *extra: str) -> list[str]:
    models = _file(folder, "zoo.yaml", LISTED)
    return ["zoo", "--models", models, "--out", str(folder / "out"), *extra]


def _rows(folder: Path, *names: str) -> str:
    """A rows folder holding the committed resnet50 row under each of `names`."""
    rows = folder / "rows"
    rows.mkdir()
    for name in names:
        shutil.copy(ROWS / "resnet50.json", rows / name)
    return str(rows)


def _page(folder: Path) -> str:
    return _file(folder, "zoo.md", PAGE)


def _pipes_folder(folder: Path, name: str) -> str:
    (folder / name).mkdir()
    _pipe(folder / name, "x.json")
    return str(folder / name)


@dataclass(frozen=True)
class Case:
    """A refused command (from the case's own folder), what its one line says, its status."""

    argv: Callable[[Path], list[str]]
    needles: tuple[str, ...]
    code: int = 1


PIPE = "it is a named pipe, not a file"
CASES: dict[str, Case] = {
    # every reader of a user file: a pipe, a folder or a missing path is said, never opened
    "config-pipe": Case(lambda f: ["run", "--config", _pipe(f, "c.json")], ("study config", PIPE)),
    "config-folder": Case(lambda f: ["run", "--config", str(f)], ("it is a folder, not a file",)),
    "class-list-pipe": Case(lambda f: _run(f, "--class-list", _pipe(f, "c.txt")), (PIPE,)),
    "policy-pipe": Case(lambda f: _run(f, "--policy", _pipe(f, "p.yaml")), ("policy", PIPE)),
    "recipe-pipe": Case(lambda f: _run(f, "--recipe", _pipe(f, "r.yaml")), ("recipe", PIPE)),
    "data-pipe": Case(lambda f: _run(f, "--data", _pipe(f, "d")), ("is a named pipe",)),
    "weights-pipe": Case(
        lambda f: [*_run(f)[:3], _pipe(f, "w.pth"), *_run(f)[4:]], ("it is a named pipe",)
    ),
    "gains-pipe": Case(lambda f: _search(f, _pipe(f, "g.json")), ("gains file", PIPE)),
    "sweep-pipe": Case(lambda f: ["sweep", _pipe(f, "s.yaml"), "--dry-run"], ("sweep file", PIPE)),
    "zoo-row-pipe": Case(
        lambda f: _zoo(f, "--rows", _pipes_folder(f, "rows"), "--page", _page(f)),
        ("zoo row", PIPE),
    ),
    "bench-report-pipe": Case(
        lambda f: ["bench", "report", _pipes_folder(f, "records")], ("bench record", PIPE)
    ),
    "peers-merge-pipe": Case(
        lambda f: ["bench", "peers-merge", _pipe(f, "a.json"), "--out", str(f / "m.json")],
        ("bench record", PIPE),
    ),
    # no value changes type, and a refusal gives the reason of the bound it broke
    "config-seed-true": Case(
        lambda f: [
            "run",
            "--config",
            _file(f, "c.json", json.dumps({"model": MODEL, "data": "data", "seed": True})),
        ],
        ("c.json: seed: input should be a valid integer (got True)",),
    ),
    "gains-schema": Case(
        lambda f: _search(f, _file(f, "g.json", '{"batch": "x", "saved_ms": {}}')),
        ("gains file", "batch: Input should be a valid integer"),
    ),
    "batches-0": Case(lambda f: _run(f, "--batches", "0,128"), ("--batches", "greater than")),
    # an option that would be dropped unsaid
    "package-without-speed": Case(lambda f: _run(f, "--package"), ("--package", "--no-speed")),
    "package-on-cpu": Case(
        lambda f: [a for a in _run(f, "--package") if a != "--no-speed"], ("--package", "cpu")
    ),
    # the zoo's committed rows and page
    "zoo-rows-missing": Case(
        lambda f: _zoo(f, "--rows", str(f / "missing"), "--page", _page(f)),
        ("does not exist",),
    ),
    "zoo-rows-twice": Case(
        lambda f: _zoo(f, "--rows", _rows(f, "resnet50.json", "old.json"), "--page", _page(f)),
        ("old.json and", "both hold the row of resnet50"),
    ),
    "zoo-rows-on-cpu": Case(
        lambda f: _zoo(f, "--data", "data", "--device", "cpu", "--rows", _rows(f, "resnet50.json")),
        ("--rows", "measured on a GPU"),
    ),
    "zoo-page-folder": Case(
        lambda f: _zoo(f, "--rows", _rows(f, "resnet50.json"), "--page", str(f)),
        ("--page", "is not a file"),
    ),
    "zoo-jobs-0": Case(lambda f: _zoo(f, "--data", "data", "--jobs", "0"), ("--jobs",), code=2),
    "zoo-workers-0": Case(
        lambda f: _zoo(f, "--data", "data", "--workers", "0"), ("--workers",), code=2
    ),
    "sweep-workers-0": Case(
        lambda f: ["sweep", _file(f, "s.yaml", ONE_POINT), "--workers", "0", "--dry-run"],
        ("--workers must be at least 1",),
    ),
    "zoo-jobs-negative": Case(
        lambda f: _zoo(f, "--data", "data", "--jobs", "-1", "--dry-run"), ("--jobs",), code=2
    ),
    "package-range-of-one": Case(
        lambda f: ["package", str(f), "--dynamic-batch", "4:4"], ("--dynamic-batch",), code=2
    ),
}


@pytest.fixture(scope="module")
def refused(workspace, tmp_path_factory) -> dict[str, tuple[Result, Path]]:
    """Every case's command, two at a time; a command that blocked on a pipe times out."""
    root = tmp_path_factory.mktemp("user-files")

    def one(name: str) -> tuple[str, Result, Path]:
        folder = root / name
        folder.mkdir()
        return name, quantstudy(*CASES[name].argv(folder), cwd=workspace, timeout=120), folder

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: (r, folder) for name, r, folder in pool.map(one, sorted(CASES))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_is_refused_in_one_line_and_loses_nothing(refused, name):
    r, folder = refused[name]
    case = CASES[name]
    if case.code == 2:
        assert_usage_error(r, r.err.split("usage: quantstudy ")[1].split()[0], *case.needles)
    else:
        line = assert_one_line_error(r, *case.needles, code=case.code)
        assert "do not fit" not in line  # batches-0: the lower bound's reason, not the upper's
    assert not (folder / "out" / "study.json").exists()
    if (folder / "zoo.md").exists():
        assert (folder / "zoo.md").read_text() == PAGE  # the page is never rewritten
    if (folder / "rows" / "resnet50.json").exists():  # a committed row is never replaced
        assert (folder / "rows" / "resnet50.json").read_bytes() == (
            ROWS / "resnet50.json"
        ).read_bytes()


def test_two_zoo_runs_never_share_their_out_folder(workspace, tmp_path):
    """The second is refused at once, naming the folder and the holder (a lock on --out)."""
    out = tmp_path / "out"
    out.mkdir()
    models = _file(tmp_path, "zoo.yaml", LISTED)
    with (out / ".lock").open("a+") as held:  # what a running zoo holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()}\n")
        held.flush()
        argv = ["zoo", "--data", "data", "--device", "cpu", "--models", models, "--out", str(out)]
        r = quantstudy(*argv, cwd=workspace, timeout=120)
    line = assert_one_line_error(r, str(out), "in use by another quantstudy run", "--out")
    assert f"pid {os.getpid()}" in line
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # no study started


def test_two_sweeps_never_share_their_out_folder(workspace, tmp_path):
    """A second sweep into a folder a sweep is running in is refused at once, naming the folder
    and the holder, as the zoo's is; nothing of the first is touched."""
    out = tmp_path / "out"
    out.mkdir()
    sweep = _file(
        tmp_path, "sweep.yaml",
        f"models:\n  - {{name: {MODEL}, weights: random}}\nrecipes: [default]\n"
        f"data: {workspace / 'data'}\ncalib: 4\nheldout: 6\ndevice: cpu\n",
    )  # fmt: skip
    with (out / ".lock").open("a+") as held:  # what a running sweep holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()}\n")
        held.flush()
        r = quantstudy("sweep", sweep, "--out", str(out), cwd=workspace, timeout=120)
    line = assert_one_line_error(r, str(out), "in use by another quantstudy run", "--out")
    assert f"pid {os.getpid()}" in line
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # no study started, no summary


SWITCHED: dict[str, Callable[[Path], list[str]]] = {
    "run": lambda f: _run(f),
    "zoo": lambda f: _zoo(f, "--data", "data", "--device", "cpu", "--dry-run"),
    "sweep": lambda f: ["sweep", _file(f, "s.yaml", ONE_POINT), "--out", str(f / "o"), "--dry-run"],
}


@pytest.mark.parametrize("command", sorted(SWITCHED))
def test_a_junk_lab_switch_is_refused_on_the_cpu_too(workspace, tmp_path, command):
    """A lab switch no kernel reads on the CPU would still be recorded as in effect: a value
    its code does not take is refused in one line before anything runs (`quant/kernels/
    switches.py`), `--dry-run` too."""
    argv = SWITCHED[command](tmp_path)
    env = {"QUANTSTUDY_GEMM_CONFIGS": "lots"}
    r = quantstudy(*argv, cwd=workspace, timeout=120, env=env)
    assert_one_line_error(r, "QUANTSTUDY_GEMM_CONFIGS='lots'", "a whole number of configs")
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["pipe", "folder"])
def test_package_check_refuses_a_manifest_that_is_not_a_file(study, tmp_path, kind):
    """`package --check` of a folder whose manifest.json is a pipe or a folder: refused unopened
    in one line, naming it (a pipe would block the reader); nothing is packaged over it."""
    out = tmp_path / "package"
    out.mkdir()
    manifest = out / "manifest.json"
    os.mkfifo(manifest) if kind == "pipe" else manifest.mkdir()
    argv = ["package", str(study), "--check", "--out", str(out), "--device", "cpu"]
    r = quantstudy(*argv, cwd=tmp_path, timeout=120)
    assert_one_line_error(r, f"package manifest {manifest}", "not a file")
    assert [p.name for p in out.iterdir()] == ["manifest.json"]


@pytest.mark.parametrize("command", ["report", "decide", "package"])
def test_a_study_command_never_advises_an_out_it_does_not_have(study, tmp_path, command):
    """`report`, `decide` and `package` act on a study folder, which a run's lock keeps from
    them; the refusal says to wait, never to give another --out (report and decide have none)."""
    from tests.reliability._drive import copy_study

    folder = copy_study(study, tmp_path / "study")
    with (folder / ".lock").open("a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = quantstudy(command, str(folder), cwd=tmp_path)
    line = assert_one_line_error(r, str(folder), "in use by another quantstudy run")
    assert "--out" not in line
