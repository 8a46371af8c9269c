"""Class 4: a record edited after its study is refused by `quantstudy report`, and a report is
rendered only from a record that agrees with itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._drive import (
    FINISHED,
    Result,
    assert_one_line_error,
    copy_study,
    quantstudy,
)

MODIFIED = "this record was modified after the study"
DISAGREES = "does not agree with itself"


def _agreement(d: dict[str, Any]) -> None:
    fp8 = next(e for e in d["quality"]["engines"] if e["engine"] == "fp8")
    fp8["agreement"] = 0.999


def _gate(d: dict[str, Any]) -> None:
    gate = next(g for g in d["decision"]["gates"] if g.get("value") is not None)
    gate["value"] = gate["value"] + 0.5


def _failed_list(d: dict[str, Any]) -> None:
    passed = next(g["name"] for g in d["decision"]["gates"] if g["status"] != "fail")
    d["decision"]["failed"] = [*d["decision"]["failed"], passed]


def _outcome(d: dict[str, Any]) -> None:
    d["decision"]["outcome"] = "ship"


def _status(d: dict[str, Any]) -> None:
    d["status"] = "partial" if d["status"] == "complete" else "complete"


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "number-in-quality": (_agreement, MODIFIED),
    "section-deleted": (lambda d: d.pop("calibration"), MODIFIED),
    "engines-emptied": (lambda d: d.update(engines=[]), MODIFIED),
    "held-out-count": (lambda d: d["data"]["heldout"].update(n_images=1300), MODIFIED),
    "config-seed": (lambda d: d["config"].update(seed=7), MODIFIED),
    "status": (_status, MODIFIED),
    "digest-forged": (lambda d: d.update(digest="0" * 64), MODIFIED),
    "gate-value": (_gate, DISAGREES),
    "failed-list": (_failed_list, DISAGREES),
    "outcome": (_outcome, DISAGREES),
    "decision-deleted": (lambda d: d.pop("decision"), DISAGREES),
}


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "study.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def rendered(study, tmp_path_factory) -> dict[str, tuple[Result, Path, bytes]]:
    """`quantstudy report` of each edited copy of the study, two at a time: (what it printed,
    the copy, the copy's report.md before)."""
    root = tmp_path_factory.mktemp("edited")

    def one(case: str) -> tuple[str, Result, Path, bytes]:
        folder = copy_study(study, root / case)
        if case in EDITS:
            _edit(folder, EDITS[case][0])
        elif case == "re-indented":  # layout is not content
            data = json.loads((folder / "study.json").read_text())
            (folder / "study.json").write_text(json.dumps(dict(reversed(data.items())), indent=4))
        before = (folder / "report.md").read_bytes()
        return case, quantstudy("report", str(folder), cwd=root), folder, before

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {c: (r, f, b) for c, r, f, b in pool.map(one, [*EDITS, "intact", "re-indented"])}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_record_is_refused_and_no_report_published(rendered, case):
    r, folder, before = rendered[case]
    assert_one_line_error(r, str(folder / "study.json"), EDITS[case][1])
    assert (folder / "report.md").read_bytes() == before  # the old report is not replaced


@pytest.mark.parametrize("case", ["intact", "re-indented"])
def test_an_intact_record_renders_the_same_report(rendered, case):
    r, folder, before = rendered[case]
    assert r.code == 0, r.err
    assert (folder / "report.md").read_bytes() == before


def test_a_decision_taken_again_keeps_the_record_sealed(study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    r = quantstudy("decide", str(folder), "--policy", "strict", cwd=tmp_path)
    assert r.code in FINISHED and "Traceback" not in r.text, r.err
    assert json.loads((folder / "study.json").read_text())["decision"]["policy"].endswith("strict")
    again = quantstudy("report", str(folder), cwd=tmp_path)
    assert again.code == 0, again.err


def test_the_studys_own_decision_survives_any_number_of_decisions_taken_again(study, tmp_path):
    """Each `decide` takes the decision again; the study's own (the one `run` took: its outcome
    and policy) is carried on, never replaced by the decision the last `decide` took."""
    own = json.loads((study / "study.json").read_text())["decision"]
    folder = copy_study(study, tmp_path / "study")
    for policy in ("strict", "latency-first", "default"):
        r = quantstudy("decide", str(folder), "--policy", policy, cwd=tmp_path)
        assert r.code in FINISHED and "Traceback" not in r.text, r.err
        decision = json.loads((folder / "study.json").read_text())["decision"]
        assert decision["policy"] == f"builtin:{policy}"
        again = decision["redecided"]
        assert (again["previous_outcome"], again["previous_policy"]) == (
            own["outcome"],
            own["policy"],
        )
    words = {"ship": "shipped", "not_ship": "not shipped", "inconclusive": "inconclusive"}
    said = f"the study's own decision was {words[own['outcome']]} under builtin:default"
    assert own["policy"] == "builtin:default" and said in (folder / "report.md").read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no study record"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a study record"),
        ('{"schema_version": 99}', "schema_version 99"),
    ],
    ids=["missing", "not-json", "not-an-object", "future-version"],
)
def test_an_unreadable_record_is_one_line(tmp_path, content, needle):
    folder = tmp_path / "study"
    folder.mkdir()
    if content is not None:
        (folder / "study.json").write_text(content)
    assert_one_line_error(quantstudy("report", str(folder), cwd=tmp_path), needle)
