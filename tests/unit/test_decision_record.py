"""The decision in the record: typed gates, and text gates of older records converted on load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantstudy.record import StudyRecord
from quantstudy.record.vocab import GateStatus, Outcome
from quantstudy.report.markdown import render_markdown
from quantstudy.report.selfcheck import check_markdown

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tf_efficientnet_lite0-h200"
pytestmark = pytest.mark.committed("examples/tf_efficientnet_lite0-h200/study.json")

# A decision as schema 5 and earlier wrote it: text gates and a ship flag.
TEXT_DECISION = {
    "ship": False,
    "policy": "builtin:default",
    "failed": ["speed margin at batch 1", "top-1 agreement"],
    "summary": "Not shipped under builtin:default: 2 of 3 gates failed "
    "(speed margin at batch 1, top-1 agreement).",
    "gates": [
        {
            "name": "speed margin at batch 1",
            "kind": "speed",
            "threshold": "median x >= 1.05 (compile mode default)",
            "measured": "median x 0.87 (fp16 0.301 ms, FP8 0.346 ms)",
            "passed": False,
            "skipped_reason": None,
        },
        {
            "name": "top-1 agreement",
            "kind": "quality",
            "threshold": ">= 97.00% of held-out images",
            "measured": "94.92% (66 of 1300 differ)",
            "passed": False,
            "skipped_reason": None,
        },
        {
            "name": "no NaN/Inf",
            "kind": "quality",
            "threshold": "no NaN/Inf logit on any held-out or stress input of any engine",
            "measured": "none in 6 engines (1300 held-out and 29 stress inputs each)",
            "passed": True,
            "skipped_reason": None,
        },
    ],
}


def _old_record() -> StudyRecord:
    data = json.loads((EXAMPLE / "study.json").read_text())
    return StudyRecord.model_validate(data | {"decision": TEXT_DECISION})


def test_text_gates_convert_on_load():
    d = _old_record().decision
    assert d.outcome == Outcome.NOT_SHIP and not d.ship and not bool(d)
    statuses = [g.status for g in d.gates]
    assert statuses == [GateStatus.FAIL, GateStatus.FAIL, GateStatus.PASS]
    g = d.gates[0]
    assert g.metric is None and g.value is None
    assert g.threshold_text == "median x >= 1.05 (compile mode default)"
    assert g.measured.startswith("median x 0.87")


def test_text_decision_still_renders_as_recorded():
    record = _old_record()
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert md.startswith("# FP8 quantization study (not shipped):")
    assert TEXT_DECISION["summary"] in md
    row = next(line for line in md.splitlines() if line.startswith("| top-1 agreement |"))
    assert "94.92% (66 of 1300 differ)" in row and "**fail**" in row
    revisit = md.split("## When to revisit")[1]
    assert "speed margin at batch 1: median x 0.87" in revisit


def test_typed_decision_round_trips_with_every_field():
    record = StudyRecord.model_validate_json((EXAMPLE / "study.json").read_text())
    dumped = record.decision.model_dump(mode="json")
    assert dumped["outcome"] in {o.value for o in Outcome}
    again = type(record.decision).model_validate(dumped)
    assert again == record.decision
    assert all(
        {"status", "value", "low", "high", "threshold", "baseline"} <= set(g)
        for g in dumped["gates"]
    )
