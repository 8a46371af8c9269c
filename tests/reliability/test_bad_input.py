"""Class 1: bad input is refused with one line, skipped with a reason, or used correctly;
never accepted in silence."""

from __future__ import annotations

import json

import pytest
import torch

from tests.reliability._drive import (
    MODEL,
    WNIDS,
    assert_one_line_error,
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


def _recipe(tmp_path, kernel: int = 1, fmt: str = "fp8_e4m3", extra: str = "") -> str:
    path = tmp_path / "recipe.yaml"
    text = RECIPE.format(name="r", format=fmt, kernel=kernel, why="the suite's rule") + extra
    path.write_text(text)
    return str(path)


# --- refused before anything heavy (no torch import) -----------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--data", "missing", "--data missing does not exist"),
        ("--data", "classes.txt", "--data classes.txt is a file"),
        ("--calib-data", "missing", "--calib-data missing does not exist"),
        ("--class-list", "missing.txt", "class list missing.txt does not exist"),
        ("--recipe", "missing.yaml", "missing.yaml"),
        ("--policy", "missing.yaml", "policy not found"),
    ],
)
def test_missing_path_is_one_line(workspace, tmp_path, option, value, needle):
    out = tmp_path / "out"
    r = quantstudy(*study_args(out, option, value), cwd=workspace)
    assert_one_line_error(r, needle)
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (f"{WNIDS[0]}\n\n{WNIDS[1]}\n", "empty line 2"),
        (f"{WNIDS[0]}\n{WNIDS[1]}\n{WNIDS[0]}\n", "repeated on line 3"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
    ],
    ids=["empty-line", "repeated", "binary"],
)
def test_bad_class_list_is_one_line(workspace, tmp_path, content, needle):
    path = tmp_path / "classes.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    r = quantstudy(*study_args(tmp_path / "out", "--class-list", str(path)), cwd=workspace)
    assert_one_line_error(r, needle)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("yaml", "line"),
        ("unknown-key", "unknwon"),
        ("int8", "int8 is reserved"),
    ],
)
def test_bad_recipe_file_is_one_line(workspace, tmp_path, case, needle):
    if case == "yaml":
        path = tmp_path / "recipe.yaml"
        path.write_text("name: r\nrules: [\n  - include: {op: conv2d\n")
        recipe = str(path)
    elif case == "unknown-key":
        recipe = _recipe(tmp_path, extra="unknwon: 1\n")
    else:
        recipe = _recipe(tmp_path, fmt="int8")
    r = quantstudy(*study_args(tmp_path / "out", "--recipe", recipe), cwd=workspace)
    assert_one_line_error(r, needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("version: 1\nquality:\n  min_agreement: 97\n", "got 97"),  # percent, not fraction
        ("version: 1\nspeed:\n  min_sppedup: 1.1\n", "min_sppedup"),
        ("version: 1\nspeed:\n  min_speedup: 0.9\n", "min_speedup"),  # ships a slower engine
    ],
    ids=["percent-for-fraction", "typo", "slower-ships"],
)
def test_bad_policy_content_is_one_line(workspace, tmp_path, text, needle):
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    r = quantstudy(*study_args(tmp_path / "out", "--policy", str(policy)), cwd=workspace)
    assert_one_line_error(r, needle)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--calib", "0"], 1),
        (["--batches", "1,a"], 2),
        (["--device", "tpu"], 2),
    ],
    ids=["calib-0", "batches", "device"],
)
def test_bad_option_value(workspace, tmp_path, args, code):
    r = quantstudy(*study_args(tmp_path / "out", *args), cwd=workspace)
    assert r.code == code and "Traceback" not in r.text
    assert r.err.rstrip().splitlines()[-1].startswith("quantstudy")  # argparse says it too


# --- refused once the model is known, before any image is decoded -----------------------------


def test_recipe_selecting_no_layer_is_refused(workspace, tmp_path):
    out = tmp_path / "out"
    recipe = _recipe(tmp_path, kernel=7)  # no 7x7 conv in this model
    r = quantstudy(*study_args(out, "--recipe", recipe), cwd=workspace)
    assert_one_line_error(r, "selects no layer", "recipes show")
    assert not out.exists()  # no "complete FP8 study" of zero FP8 layers


def test_class_list_of_another_length_is_refused(workspace, tmp_path):
    path = tmp_path / "ten.txt"
    path.write_text("\n".join([*WNIDS, *[f"n0000000{i}" for i in range(8)]]) + "\n")
    r = quantstudy(*study_args(tmp_path / "out", "--class-list", str(path)), cwd=workspace)
    assert_one_line_error(r, "names 10 classes", "predicts 1000")


def test_unknown_model_is_one_line_with_a_suggestion(workspace, tmp_path):
    args = study_args(tmp_path / "out")
    args[1] = MODEL[:-1]
    r = quantstudy(*args, cwd=workspace)
    assert_one_line_error(r, MODEL)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
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


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("other", "another architecture"),
        ("truncated", "not a PyTorch checkpoint"),
        ("garbage", "not a PyTorch checkpoint"),
        ("nostate", "not a state dict"),
    ],
)
def test_bad_checkpoint_is_one_line(workspace, tmp_path, checkpoints, name, needle):
    args = study_args(tmp_path / "out")
    args[args.index("random")] = str(checkpoints / f"{name}.pth")
    assert_one_line_error(quantstudy(*args, cwd=workspace), needle)


# --- used correctly, or skipped with the reason: the shared study ----------------------------


def test_every_image_mode_is_used_or_skipped_with_its_reason(study):
    record = json.loads((study / "study.json").read_text())
    skipped = {s["id"]: s["reason"] for s in record["data"]["skipped"]}
    assert set(skipped) == set(SKIPPED)
    for name, reason in SKIPPED.items():
        assert reason in skipped[name], skipped[name]
    used = record["data"]["calibration"]["ids"] + record["data"]["heldout"]["ids"]
    assert len(used) == USABLE  # every usable image, each in one set
    modes = {"grey16.png", "rgba.png", "grey_alpha.png", "cmyk.jpg", "exif.jpg", "bits.png"}
    assert modes <= {i.split("/")[1] for i in used}
    report = (study / "report.md").read_text()
    assert "float.tif" in report and "no defined 8-bit range" in report


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


# --- sweep files -----------------------------------------------------------------------------

SWEEP = """\
models:
  - {{name: {model}, weights: random}}
recipes: [default]
data: {data}
calib: 4
heldout: 6
{extra}"""


@pytest.mark.parametrize(
    ("data", "extra", "needle"),
    [
        ("missing", "", "line 4: data"),
        ("data", "sedes: [0]\n", "unknown key 'sedes'"),
        ("data", "seeds: [0, 0]\n", "listed twice"),
    ],
    ids=["missing-data", "typo", "repeated-seed"],
)
def test_bad_sweep_file_is_one_line(workspace, tmp_path, data, extra, needle):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP.format(model=MODEL, data=workspace / data, extra=extra))
    r = quantstudy("sweep", str(sweep), "--out", str(tmp_path / "out"), "--dry-run", cwd=tmp_path)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "out").exists()
