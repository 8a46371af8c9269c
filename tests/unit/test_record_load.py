"""Every command that reads a study record goes through one reader (`record/load.py`), so a
record of a schema this quantstudy does not know (one written by a newer quantstudy) is refused
by each of them in the same one line, naming the version and the fix, and is left as it was.

The commands run in this process (`quantstudy.cli.main`): the refusal comes before any model,
data or package work, so each case takes milliseconds. `run` and the sweep read a record only
inside a longer job; their reading is checked where it happens (the study folder's claim, a
sweep point's row and whether a point is finished).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from _records import build_record

from quantstudy.cli import main
from quantstudy.record import SCHEMA_VERSION, StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_record
from quantstudy.record.load import RECORD_FILE, load_record, load_record_data
from quantstudy.study.guard import claim_study_folder
from quantstudy.sweep.events import Job
from quantstudy.sweep.grid import GridPoint
from quantstudy.sweep.point import is_finished
from quantstudy.sweep.summary import collect_row

NEWER = SCHEMA_VERSION + 1
REFUSAL = (f"has schema_version {NEWER}", "newer quantstudy", "upgrade quantstudy")


def _newer(folder: Path) -> Path:
    """A sealed record made newer as a newer quantstudy would write it: its version and a
    section this one does not know."""
    folder.mkdir(parents=True, exist_ok=True)
    write_record(folder / RECORD_FILE, build_record(device="cpu"))
    data = json.loads((folder / RECORD_FILE).read_text())
    data |= {"schema_version": NEWER, "a_later_section": {"rows": []}}
    (folder / RECORD_FILE).write_text(json.dumps(data, indent=1) + "\n")
    return folder


@pytest.fixture
def newer(tmp_path) -> Path:
    return _newer(tmp_path / "study")


# the arguments each command needs besides the study folder (paths that need not exist: the
# record is refused before anything else is read)
COMMANDS = {
    "report": [],
    "decide": ["--policy", "strict"],
    "export": [],
    "extend": ["--data", "more-images"],
    "package": [],
    "import-trt": ["--fp16", "fp16-exports", "--fp8", "fp8-exports"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_refuses_a_newer_record_in_one_line(newer, tmp_path, capsys, command):
    if command == "export" and importlib.util.find_spec("onnx") is None:
        pytest.skip("export refuses first for want of onnx (the `onnx` extra)")
    before = (newer / RECORD_FILE).read_bytes()
    code = main([command, str(newer), *COMMANDS[command]])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("quantstudy: error:") and all(t in lines[0] for t in REFUSAL)
    assert (newer / RECORD_FILE).read_bytes() == before
    written = sorted(p.name for p in newer.iterdir() if p.name != ".lock")  # the folder's lock
    assert written == [RECORD_FILE]  # no report, package or export beside it


def test_a_known_record_still_loads_and_keeps_its_json(tmp_path):
    write_record(tmp_path / RECORD_FILE, build_record(device="cpu"))
    record, data = load_record_data(tmp_path / RECORD_FILE)
    assert record.schema_version == SCHEMA_VERSION == data["schema_version"]


@pytest.mark.parametrize("version", [0, "15", True, None])
def test_a_version_that_is_no_version_is_refused(tmp_path, version):
    write_record(tmp_path / RECORD_FILE, build_record(device="cpu"))
    data = json.loads((tmp_path / RECORD_FILE).read_text()) | {"schema_version": version}
    (tmp_path / RECORD_FILE).write_text(json.dumps(data))
    with pytest.raises(UserError, match=f"schema_version {version!r}; this quantstudy reads"):
        load_record(tmp_path / RECORD_FILE)


def test_run_keeps_a_newer_record_in_its_folder_unless_forced(newer):
    record = build_record(device="cpu")
    with pytest.raises(UserError, match=r"newer quantstudy.*pass --force to replace it"):
        claim_study_folder(newer, record, force=False)
    assert json.loads((newer / RECORD_FILE).read_text())["schema_version"] == NEWER
    claim_study_folder(newer, record, force=True).release()
    assert not (newer / RECORD_FILE).exists()  # replaced, as --force asks


def test_a_sweep_point_with_a_newer_record_is_a_failed_row_not_a_finished_point(tmp_path):
    config = StudyConfig(
        model="test_efficientnet", weights="random", recipe="generic_all", data=str(tmp_path),
        calib=4, heldout=8, batches=(1,), device="cpu", fp8_kernel="fused", speed=False,
    )  # fmt: skip
    point = GridPoint(config=config)
    _newer(tmp_path / "out" / "p0")
    row = collect_row(Job(point, "p0"), tmp_path / "out")
    assert row.status == "failed" and all(t in (row.error or "") for t in REFUSAL)
    assert not is_finished(tmp_path / "out" / "p0")
