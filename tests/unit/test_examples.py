"""The committed example studies: schema round trip, deterministic re-render, self-check."""

import json
import shutil
from pathlib import Path

import pytest

from quantstudy.report.render import render_study
from quantstudy.report.selfcheck import check_markdown
from quantstudy.study.schema import SCHEMA_VERSION, StudyRecord

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/study.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_study_json_round_trips_its_schema(path):
    raw = json.loads(path.read_text())
    record = StudyRecord.model_validate(raw)
    assert record.schema_version == SCHEMA_VERSION
    assert record.model_dump(mode="json") == raw


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_committed_report_is_what_the_record_renders(path, tmp_path):
    shutil.copy(path, tmp_path / "study.json")
    md = render_study(tmp_path).read_text()
    assert md == (path.parent / "report.md").read_text()
    assert check_markdown(md, StudyRecord.model_validate_json(path.read_text())) == []


def test_examples_are_present():
    names = {p.parent.name for p in EXAMPLES}
    assert {"mobilenetv4_conv_large-random-h200", "tf_efficientnet_lite0-h200"} <= names
