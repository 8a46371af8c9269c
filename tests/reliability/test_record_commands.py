"""Class 4, the commands that act on a finished record (`report`, `decide`, `export`): each
holds the study folder's lock as `run` does, and each checks the seal before it uses a number.

A record whose digest was deleted is not sealed: `report` renders it under an "Unsealed
record" banner; `decide` (which would decide its numbers) and `export` (which would ship
them) refuse it, and their refusal names the study, never `decide`, as the fix. An edited
record is refused by all three. `export` also refuses a partial study and says how to install
its optional dependency when it is missing.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from quantstudy.record.study import record_digest
from tests.reliability._drive import assert_one_line_error, copy_study, quantstudy


def _rewrite(folder: Path, change, seal: bool = False) -> None:
    path = folder / "study.json"
    data = json.loads(path.read_text())
    change(data)
    if seal:  # as a forger (or a test) can: the digest catches edits, not forgery
        data["digest"] = record_digest(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _forge_quality(data: dict) -> None:
    fp8 = next(e for e in data["quality"]["engines"] if e["engine"] == "fp8")
    fp8["agreement"] = 0.999


@pytest.fixture
def undigested(study, tmp_path) -> Path:
    folder = copy_study(study, tmp_path / "study")
    _rewrite(folder, lambda d: d.pop("digest"))
    return folder


def test_report_renders_an_unsealed_record_under_a_banner(undigested, tmp_path):
    r = quantstudy("report", str(undigested), cwd=tmp_path)
    assert r.code == 0, r.err
    assert "**Unsealed record**" in (undigested / "report.md").read_text()


@pytest.mark.parametrize("command", ["decide", "export"])
def test_an_unsealed_record_is_refused_by_the_commands_that_use_its_numbers(
    undigested, tmp_path, command
):
    before = (undigested / "study.json").read_bytes()
    r = quantstudy(command, str(undigested), cwd=tmp_path)
    line = assert_one_line_error(r, "carries no digest", f"{command} refuses it", "rerun the study")
    assert "quantstudy decide" not in line  # deciding again would bless unsealed numbers
    assert (undigested / "study.json").read_bytes() == before
    assert not (undigested / "tensorrt").exists()


def test_forged_numbers_without_a_digest_are_not_decided_again(undigested, tmp_path):
    _rewrite(undigested, _forge_quality)
    r = quantstudy("decide", str(undigested), cwd=tmp_path)
    assert_one_line_error(r, "carries no digest")


@pytest.mark.parametrize("command", ["decide", "export"])
def test_an_edited_record_is_refused(study, tmp_path, command):
    folder = copy_study(study, tmp_path / "study")
    _rewrite(folder, _forge_quality)
    before = (folder / "study.json").read_bytes()
    r = quantstudy(command, str(folder), cwd=tmp_path)
    assert_one_line_error(r, "this record was modified after the study")
    assert (folder / "study.json").read_bytes() == before


@pytest.mark.parametrize("command", ["report", "decide", "export"])
def test_a_folder_a_run_is_writing_is_refused(study, tmp_path, command):
    folder = copy_study(study, tmp_path / "study")
    before = (folder / "study.json").read_bytes()
    with (folder / ".lock").open("a+") as held:  # what a running study holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"pid {os.getpid()}\n")
        held.flush()
        r = quantstudy(command, str(folder), cwd=tmp_path)
    assert_one_line_error(r, str(folder), "in use by another quantstudy run")
    assert (folder / "study.json").read_bytes() == before


def test_export_refuses_a_partial_study(study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    _rewrite(folder, lambda d: d.update(status="partial", decision=None), seal=True)
    r = quantstudy("export", str(folder), cwd=tmp_path)
    assert_one_line_error(r, "partial study", "rerun the study's command")
    assert not (folder / "tensorrt").exists()


def test_export_without_onnx_names_the_install_command(study, tmp_path):
    """onnx hidden from the child (`sys.modules["onnx"] = None` makes it unimportable)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['onnx'] = None\n")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)
    folder = copy_study(study, tmp_path / "study")
    r = quantstudy("export", str(folder), cwd=tmp_path, env={"PYTHONPATH": path})
    assert_one_line_error(r, "export needs onnx", "pip install 'quantstudy[onnx]'")


def test_export_of_a_moved_checkpoint_names_its_own_option(workspace, tmp_path):
    """The study read a checkpoint file that is gone: export says to pass it with its own
    --weights (checked by sha256), not with an option it does not have."""
    import timm
    import torch

    checkpoint = tmp_path / "weights.pth"
    torch.save(timm.create_model("test_efficientnet").state_dict(), checkpoint)
    from tests.reliability._drive import assert_finished, study_args

    args = study_args(tmp_path / "study")
    args[args.index("random")] = str(checkpoint)
    assert_finished(quantstudy(*args, cwd=workspace))
    moved = checkpoint.rename(tmp_path / "moved.pth")
    r = quantstudy("export", str(tmp_path / "study"), cwd=workspace)
    assert_one_line_error(r, str(checkpoint), "quantstudy export --weights FILE")
    r = quantstudy("export", str(tmp_path / "study"), "--weights", str(moved), cwd=workspace)
    assert r.code == 0, r.text[-3000:]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--opset", "99"), "--opset 99"),
        (("--opset", "13"), "--opset 13"),
        (("--images", "0"), "--images"),
        (("--weights", "missing.pth"), "--weights missing.pth is not a file"),
    ],
    ids=["opset-too-new", "opset-before-fp8", "images-0", "weights-missing"],
)
def test_export_option_values_are_refused_before_the_model_loads(study, tmp_path, extra, needle):
    folder = copy_study(study, tmp_path / "study")
    r = quantstudy("export", str(folder), *extra, cwd=tmp_path)
    assert_one_line_error(r, needle)
    assert not (folder / "tensorrt").exists()


@pytest.fixture(scope="module")
def exported(workspace, study, tmp_path_factory) -> Path:
    """A copy of the shared study, exported (`quantstudy export`): what import-trt reads."""
    folder = copy_study(study, tmp_path_factory.mktemp("exported") / "study")
    assert quantstudy("export", str(folder), cwd=workspace).code == 0  # its data, relative
    return folder


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_import_trt_of_a_time_that_is_not_finite_is_bad_input(workspace, exported, tmp_path, value):
    """trtexec's exports (tests/fixtures/trtexec, made for this model and recipe) with a time
    that is no number: the user's file is wrong, so one line and exit 1, not an internal error;
    no TensorRT study is written. Each case on its own copy of the one exported study."""
    import shutil

    folder = copy_study(exported, tmp_path / "study")
    exports = shutil.copytree(Path(__file__).parents[1] / "fixtures" / "trtexec", tmp_path / "trt")
    times = exports / "fp16" / "b1.times.json"
    rows = json.loads(times.read_text())
    rows[3]["computeMs"] = value  # written below as the bare literal trtexec would write
    times.write_text(json.dumps(rows).replace(f'"{value}"', value))
    argv = ["import-trt", str(folder), "--fp16", str(exports / "fp16"), "--fp8"]
    argv += [str(exports / "fp8"), "--onnx", str(folder / "tensorrt" / "model.onnx")]
    r = quantstudy(*argv, "--out", str(tmp_path / "trt-study"), cwd=workspace)
    assert_one_line_error(r, "b1.times.json: entry 3 has no finite numeric computeMs")
    assert not (tmp_path / "trt-study").exists()
