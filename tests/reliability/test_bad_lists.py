"""Lists of models and sweep files as a hostile user writes them: each mistake ends in one line
naming the file, line and key, exit 1, before any study runs; `--dry-run` refuses what the
studies would and writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.reliability._drive import MODEL, Result, assert_one_line_error, quantstudy

SWEEP = """\
models:
  - {{name: {model}, weights: {weights}}}
recipes: [{recipe}]
data: {data}
calib: {calib}
heldout: 6
{extra}"""
ONE = f"models:\n  - {{name: {MODEL}}}\n"

Argv = Callable[[Path, Path], list[str]]  # (case folder, workspace) -> argv


def _sweep(extra: str = "", recipe: str = "default", weights: str = "random", calib: str = "4",
           models: str | None = None) -> Argv:  # fmt: skip
    """`sweep --dry-run` of a sweep file in the case's folder (its data: the workspace's)."""

    def argv(folder: Path, workspace: Path) -> list[str]:
        fields = {"model": MODEL, "weights": weights, "recipe": recipe, "calib": calib}
        text = SWEEP.format(**fields, data=workspace / "data", extra=extra)
        if models is not None:
            text = text.replace(text[: text.index("recipes:")], models)
        (folder / "sweep.yaml").write_text(text)
        return ["sweep", str(folder / "sweep.yaml"), "--out", str(folder / "out"), "--dry-run"]

    return argv


def _zoo(listed: str, *extra: str) -> Argv:
    """`zoo --dry-run` of a zoo list in the case's folder."""

    def argv(folder: Path, _: Path) -> list[str]:
        (folder / "zoo.yaml").write_text(listed)
        return ["zoo", "--data", "data", "--models", str(folder / "zoo.yaml"),
                "--out", str(folder / "out"), "--dry-run", *extra]  # fmt: skip

    return argv


def _peers(listed: str) -> Argv:
    """`bench peers --rows` of a rows file in the case's folder."""

    def argv(folder: Path, _: Path) -> list[str]:
        (folder / "rows.yaml").write_text(listed)
        return ["bench", "peers", "--rows", str(folder / "rows.yaml"), "--device", "cpu",
                "--data", "data", "--out", str(folder / "out" / "peers.json")]  # fmt: skip

    return argv


@dataclass(frozen=True)
class Case:
    argv: Argv
    says: tuple[str, ...]  # in the one line
    never: tuple[str, ...] = ()  # not in it: a flag the user did not give


CASES: dict[str, Case] = {
    # a boolean is not a number: `calib: true` once ran with one calibration image
    "sweep-calib-true": Case(
        _sweep(calib="true"), ("sweep.yaml line 5: calib: True is a boolean",)
    ),
    # what its studies would refuse, refused at --dry-run
    "sweep-unknown-recipe": Case(
        _sweep(recipe="no_such_recipe"),
        ("sweep.yaml line 3: recipes.0: unknown recipe 'no_such_recipe'",),
    ),
    "sweep-missing-checkpoint": Case(
        _sweep(weights="gone.pth"),
        ("sweep.yaml line 2: models.0.weights: checkpoint", "gone.pth does not exist"),
    ),
    # a bound names the file, line and key, and why; never a flag the user did not give
    "sweep-seed-negative": Case(
        _sweep("seeds: [-1]\n"),
        ("sweep.yaml line 7: seeds.0: Input should be greater than or equal to 0", "numpy's"),
        ("--seed",),
    ),
    "sweep-batch-too-large": Case(
        _sweep("batches: [1, 100000]\n"),
        ("sweep.yaml line 7: batches.1: Input should be less than or equal to 4096", "fit one"),
        ("--batches",),
    ),
    # an empty list or selection is refused, never read as the defaults
    "sweep-no-seeds": Case(
        _sweep("seeds: []\n"), ("sweep.yaml line 7: seeds: give a list of at least one value",)
    ),
    "sweep-no-models": Case(
        _sweep(models="models: []\n"), ("sweep.yaml line 1: models: is empty: list at least one",)
    ),
    "zoo-empty-list": Case(_zoo("models: []\n"), ("zoo.yaml line 1: models: is empty",)),
    "zoo-empty-file": Case(_zoo(""), ("zoo.yaml line 1: a zoo list is a mapping",)),
    "zoo-empty-shard": Case(_zoo(ONE, "--shard", "2/2"), ("--shard 2/2: the list holds 1 model",)),
    "peers-rows-empty": Case(_peers("rows: []\n"), ("rows.yaml line 1: rows: is empty",)),
}


@pytest.fixture(scope="module")
def refused(workspace, tmp_path_factory) -> dict[str, tuple[Result, Path]]:
    """Every case's command, two at a time (most of their time is Python importing)."""
    root = tmp_path_factory.mktemp("bad-lists")

    def one(name: str) -> tuple[str, Result, Path]:
        folder = root / name
        folder.mkdir()
        return name, quantstudy(*CASES[name].argv(folder, workspace), cwd=workspace), folder

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: (r, folder) for name, r, folder in pool.map(one, sorted(CASES))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_list_is_refused_in_one_line(refused, name):
    r, folder = refused[name]
    line = assert_one_line_error(r, *CASES[name].says)
    assert not any(flag in line for flag in CASES[name].never), line
    assert not (folder / "out").exists()  # nothing written, --dry-run or not


def test_a_good_sweep_s_dry_run_writes_nothing(workspace, tmp_path):
    argv = _sweep()(tmp_path, workspace)
    r = quantstudy(*argv, cwd=workspace)
    assert r.code == 0, r.text[-3000:]
    assert "1 studies in the grid" in r.err and not (tmp_path / "out").exists()
