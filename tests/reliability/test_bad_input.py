"""Class 1: bad input is refused with one line, skipped with a reason, or used correctly;
never accepted in silence."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.reliability._drive import (
    MODEL,
    WNIDS,
    Result,
    assert_one_line_error,
    assert_usage_error,
    quantstudy,
    study_args,
)
from tests.reliability.conftest import SKIPPED, USABLE

RECIPE = """\
name: {name}
description: a recipe for the reliability suite
format: {format}
weights: {{granularity: per_channel, fold_bn: true}}
activations: {{granularity: per_tensor, calibrator: max, params: {{}}}}
rules:
  - include: {{op: conv2d, kernel: {kernel}}}
    why: {why}
"""


def _recipe(folder: Path, kernel: int = 1, fmt: str = "fp8_e4m3", extra: str = "") -> str:
    path = folder / "recipe.yaml"
    text = RECIPE.format(name="r", format=fmt, kernel=kernel, why="the suite's rule") + extra
    path.write_text(text)
    return str(path)


def _file(folder: Path, name: str, content: str | bytes) -> str:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


# Nine levels of nine aliases: 387 million strings once expanded, from 600 bytes of YAML.
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _sparse(path: Path, size: int) -> str:
    """A file of `size` bytes that takes no disk."""
    with path.open("wb") as f:
        f.truncate(size)
    return str(path)


@dataclass(frozen=True)
class Case:
    """One refused command: its arguments (from the case's own folder), what the one line must
    say, the exit status."""

    argv: Callable[[Path, Path], list[str]]  # (case folder, checkpoints folder) -> argv
    needles: tuple[str, ...]
    code: int = 1


def _run(folder: Path, *extra: str) -> list[str]:
    return study_args(folder / "out", *extra)


def _weights(name: str) -> Callable[[Path, Path], list[str]]:
    def argv(folder: Path, checkpoints: Path) -> list[str]:
        args = _run(folder)
        args[args.index("random")] = str(checkpoints / f"{name}.pth")
        return args

    return argv


def _sweep(data: str, extra: str = "", model: str = MODEL) -> Callable[[Path, Path], list[str]]:
    def argv(folder: Path, _: Path) -> list[str]:
        (folder / "images").mkdir()
        text = SWEEP.format(model=model, data=data, extra=extra)
        return [
            "sweep",
            _file(folder, "sweep.yaml", text),
            "--out",
            str(folder / "out"),
            "--dry-run",
        ]

    return argv


def _search(gains: str) -> Callable[[Path, Path], list[str]]:
    """`search` with a gains file: read before the model, so refused in a second or two."""

    def argv(folder: Path, _: Path) -> list[str]:
        return ["search", *_run(folder)[1:], "--gains", _file(folder, "gains.json", gains)]

    return argv


def _zoo_dry_run(listed: str) -> Callable[[Path, Path], list[str]]:
    def argv(folder: Path, _: Path) -> list[str]:
        models = _file(folder, "zoo.yaml", f"models:\n  - {{name: {listed}, family: x}}\n")
        out = str(folder / "out")
        return ["zoo", "--data", "data", "--models", models, "--out", out, "--dry-run"]

    return argv


SWEEP = """\
models:
  - {{name: {model}, weights: random}}
recipes: [default]
data: {data}
calib: 4
heldout: 6
{extra}"""
TEN_CLASSES = "\n".join([*WNIDS, *[f"n0000000{i}" for i in range(8)]]) + "\n"

CASES: dict[str, Case] = {
    # refused before torch is imported (`preflight`)
    "data-missing": Case(
        lambda f, _: _run(f, "--data", "missing"), ("--data missing does not exist",)
    ),
    "data-is-a-file": Case(lambda f, _: _run(f, "--data", "classes.txt"), ("is a file",)),
    "calib-data-missing": Case(
        lambda f, _: _run(f, "--calib-data", "missing"), ("--calib-data missing does not exist",)
    ),
    "class-list-missing": Case(
        lambda f, _: _run(f, "--class-list", "missing.txt"), ("missing.txt does not exist",)
    ),
    "class-list-empty-line": Case(
        lambda f, _: _run(f, "--class-list", _file(f, "c.txt", f"{WNIDS[0]}\n\n{WNIDS[1]}\n")),
        ("empty line 2",),
    ),
    "class-list-repeated": Case(
        lambda f, _: _run(f, "--class-list", _file(f, "c.txt", f"{WNIDS[0]}\n{WNIDS[0]}\n")),
        ("repeated on line 2",),
    ),
    "class-list-binary": Case(
        lambda f, _: _run(f, "--class-list", _file(f, "c.txt", b"\xff\xfe\x00binary")),
        ("not UTF-8",),
    ),
    "recipe-missing": Case(lambda f, _: _run(f, "--recipe", "missing.yaml"), ("missing.yaml",)),
    "recipe-bad-yaml": Case(
        lambda f, _: _run(f, "--recipe", _file(f, "r.yaml", "name: r\nrules: [\n  - {op: c\n")),
        ("line",),
    ),
    "recipe-unknown-key": Case(
        lambda f, _: _run(f, "--recipe", _recipe(f, extra="unknwon: 1\n")), ("unknwon",)
    ),
    "recipe-int8": Case(lambda f, _: _run(f, "--recipe", _recipe(f, fmt="int8")), ("int8",)),
    "policy-missing": Case(lambda f, _: _run(f, "--policy", "missing.yaml"), ("policy not found",)),
    "policy-percent-for-fraction": Case(
        lambda f, _: _run(
            f, "--policy", _file(f, "p.yaml", "version: 1\nquality:\n  min_agreement: 97\n")
        ),
        ("got 97",),
    ),
    "policy-typo": Case(
        lambda f, _: _run(
            f, "--policy", _file(f, "p.yaml", "version: 1\nspeed:\n  min_sppedup: 1.1\n")
        ),
        ("min_sppedup",),
    ),
    "policy-ships-slower": Case(
        lambda f, _: _run(
            f, "--policy", _file(f, "p.yaml", "version: 1\nspeed:\n  min_speedup: 0.9\n")
        ),
        ("min_speedup",),
    ),
    "calib-0": Case(lambda f, _: _run(f, "--calib", "0"), ("--calib",)),
    # numbers are bounded when the config is built: a typo fails in a second, not after the
    # quality work (a batch of 100000 once died allocating 60 GB at the timing stage)
    "batches-too-large": Case(
        lambda f, _: _run(f, "--batches", "1,100000"), ("--batches", "4096", "do not fit")
    ),
    "seed-negative": Case(lambda f, _: _run(f, "--seed", "-1"), ("--seed", "0")),
    "heldout-not-a-count": Case(
        lambda f, _: _run(f, "--heldout", "10000000000"), ("--heldout", "100000000")
    ),
    # every file through one strict reader: aliases (billion laughs) refused at the first one
    "recipe-billion-laughs": Case(
        lambda f, _: _run(f, "--recipe", _file(f, "r.yaml", LAUGHS)), ("line 2", "alias")
    ),
    "policy-alias": Case(
        lambda f, _: _run(f, "--policy", _file(f, "p.yaml", "a: &x 1\nversion: *x\n")),
        ("line 2", "alias"),
    ),
    "sweep-alias": Case(_sweep("images", "seeds: &s [0]\nother: *s\n"), ("alias",)),
    "class-list-huge": Case(
        lambda f, _: _run(f, "--class-list", _sparse(f / "c.txt", 17 << 20)), ("at most 16 MiB",)
    ),
    "batches-not-numbers": Case(lambda f, _: _run(f, "--batches", "1,a"), ("--batches",), code=2),
    "device-unknown": Case(lambda f, _: _run(f, "--device", "tpu"), ("--device",), code=2),
    "sweep-data-missing": Case(_sweep("missing"), ("line 4: data",)),
    "sweep-key-typo": Case(_sweep("images", "sedes: [0]\n"), ("unknown key 'sedes'",)),
    "sweep-seed-twice": Case(_sweep("images", "seeds: [0, 0]\n"), ("listed twice",)),
    # numbers a file holds are finite, and a gains file's savings plausible
    "policy-infinite-speedup": Case(
        lambda f, _: _run(
            f, "--policy", _file(f, "p.yaml", "version: 1\nspeed:\n  min_speedup: .inf\n")
        ),
        ("line 3", ".inf is not a finite number"),
    ),
    "search-gains-nan": Case(
        _search('{"batch": 128, "saved_ms": {"conv_stem": NaN}}'), ("NaN is not a finite number",)
    ),
    "search-gains-absurd": Case(
        _search('{"batch": 128, "saved_ms": {"conv_stem": -1e30}}'),
        ("conv_stem saves -1e+30 ms", "at most 10000 ms"),
    ),
    # a model timm does not have, in a list: refused as the list is read, --dry-run too
    "zoo-unknown-model-dry-run": Case(
        _zoo_dry_run(MODEL[:-1]), ("zoo.yaml line 2: models.0.name", "unknown timm model")
    ),
    "sweep-unknown-model-dry-run": Case(
        _sweep("images", model=MODEL[:-1]), ("line 2: models.0.name", "unknown timm model")
    ),
    # refused once the model is known, before any image is decoded
    "recipe-selects-no-layer": Case(
        lambda f, _: _run(f, "--recipe", _recipe(f, kernel=7)),  # no 7x7 conv in this model
        ("selects no layer", "recipes show"),
        code=6,  # its own exit status (record/errors.py: EXIT_NOTHING_SELECTED), for the zoo
    ),
    "class-list-of-another-length": Case(
        lambda f, _: _run(f, "--class-list", _file(f, "ten.txt", TEN_CLASSES)),
        ("names 10 classes", "predicts 1000"),
    ),
    "unknown-model": Case(
        lambda f, _: [_run(f)[0], MODEL[:-1], *_run(f)[2:]], (MODEL,)
    ),  # suggests the close match
    "checkpoint-of-another-model": Case(_weights("other"), ("another architecture",)),
    "checkpoint-truncated": Case(_weights("truncated"), ("not a PyTorch checkpoint",)),
    "checkpoint-garbage": Case(_weights("garbage"), ("not a PyTorch checkpoint",)),
    "checkpoint-without-state-dict": Case(_weights("nostate"), ("not a state dict",)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    import timm

    folder = tmp_path_factory.mktemp("checkpoints")
    torch.save(timm.create_model("resnet10t").state_dict(), folder / "other.pth")
    good = folder / "good.pth"
    torch.save(timm.create_model(MODEL).state_dict(), good)
    data = good.read_bytes()
    (folder / "truncated.pth").write_bytes(data[: len(data) // 2])
    (folder / "garbage.pth").write_bytes(b"not a checkpoint" * 64)
    torch.save({"epoch": 3, "lr": 0.1}, folder / "nostate.pth")
    return folder


@pytest.fixture(scope="module")
def refused(workspace, checkpoints, tmp_path_factory) -> dict[str, tuple[Result, Path]]:
    """Every case's command, two at a time (most of their time is Python importing)."""
    root = tmp_path_factory.mktemp("bad-input")

    def one(name: str) -> tuple[str, Result, Path]:
        folder = root / name
        folder.mkdir()
        return name, quantstudy(*CASES[name].argv(folder, checkpoints), cwd=workspace), folder

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: (r, folder) for name, r, folder in pool.map(one, sorted(CASES))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_in_one_line(refused, name):
    r, folder = refused[name]
    case = CASES[name]
    if case.code == 2:  # argparse's usage error: usage, then one error line
        assert_usage_error(r, "run", *case.needles)
    else:
        assert_one_line_error(r, *case.needles, code=case.code)
    assert not (folder / "out").exists()  # nothing written: no study of bad input


# --- used correctly, or skipped with the reason: the shared study ----------------------------


def test_every_image_mode_is_used_or_skipped_with_its_reason(study):
    record = json.loads((study / "study.json").read_text())
    skipped = {s["id"]: s["reason"] for s in record["data"]["skipped"]}
    assert set(skipped) == set(SKIPPED)
    for name, reason in SKIPPED.items():
        assert reason in skipped[name], skipped[name]
    from quantstudy.record import StudyRecord
    from quantstudy.study.per_image import set_ids

    typed = StudyRecord.model_validate(record)
    assert record["data"]["heldout"]["ids"] is None  # in the per-image side file
    used = record["data"]["calibration"]["ids"] + set_ids(study, typed, typed.data.heldout)
    assert len(used) == USABLE  # every usable image, each in one set
    modes = {"grey16.png", "rgba.png", "grey_alpha.png", "cmyk.jpg", "exif.jpg", "bits.png"}
    assert modes <= {i.split("/")[1] for i in used}
    report = (study / "report.md").read_text()
    assert "float.tif" in report and "no defined 8-bit range" in report


def test_skipped_files_are_said_on_the_console(finished):
    """One line, with the count and the first few: the record and the report list them all."""
    _, result = finished
    lines = [line for line in result.err.splitlines() if "files skipped" in line]
    assert len(lines) == 1, result.err[-3000:]
    assert lines[0].startswith(f"data: {len(SKIPPED)} files skipped, not usable images: ")
    named = [name for name in SKIPPED if name in lines[0]]
    assert len(named) == 3 and f"and {len(SKIPPED) - 3} more" in lines[0]


def test_class_list_with_bom_and_names_labels_correctly(study):
    record = json.loads((study / "study.json").read_text())
    heldout = record["data"]["heldout"]
    assert record["data"]["labelled"] and heldout["n_classes"] == 2


def test_more_heldout_than_exist_is_said_on_console_and_in_report(finished):
    study, result = finished
    assert "--heldout 20 asked" in result.err and "12" in result.err
    assert (
        "| held-out images | 20 asked; 12 used (all the data had) |"
        in (study / "report.md").read_text()
    )
