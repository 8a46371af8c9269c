"""The zoo's committed rows are never damaged by a mistake: two files of one model, a folder that
is not there or holds no row, and a study folder left "running" by a killed run are each one
line or a plain answer, never a guess or an internal error (`zoo/row_files.py`,
`sweep/study_row.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantstudy.record.errors import UserError
from quantstudy.record.vocab import RowStatus
from quantstudy.sweep.point import POINT_FILE
from quantstudy.zoo.board import ZooRow, collect_row
from quantstudy.zoo.catalogue import ZooEntry
from quantstudy.zoo.points import ZooOptions, zoo_point
from quantstudy.zoo.row_files import read_rows, write_row
from quantstudy.zoo.run import write_board

ROWS = Path(__file__).resolve().parents[2] / "docs" / "results" / "zoo"


def _committed(tmp_path: Path) -> tuple[Path, ZooRow]:
    row = read_rows(ROWS)["resnet50"]
    write_row(tmp_path / "rows", row)
    return tmp_path / "rows", row


def test_two_files_of_one_model_are_refused_naming_both(tmp_path):
    rows, _row = _committed(tmp_path)
    copy = rows / "copy.json"
    copy.write_bytes((rows / "resnet50.json").read_bytes())
    with pytest.raises(UserError) as said:
        read_rows(rows)
    assert str(said.value) == (
        f"{copy} and {rows / 'resnet50.json'} both hold the row of resnet50; keep the one named "
        "resnet50.json and remove the other"
    )


@pytest.mark.parametrize("kind", ["missing", "empty", "file", "pipe"])
def test_the_page_is_never_drawn_from_no_rows(tmp_path, kind):
    """`zoo --rows X --page P`: a typo in X must not rewrite P with every model pending."""
    rows = tmp_path / "rows"
    if kind == "empty":
        rows.mkdir()
    elif kind == "file":
        rows.write_text("{}")
    elif kind == "pipe":
        os.mkfifo(rows)
    page = tmp_path / "zoo.md"
    page.write_text("the committed page\n")
    options = ZooOptions(data=Path("."), out=tmp_path, rows=rows, page=page)
    with pytest.raises(UserError, match=f"--rows {rows} "):
        write_board(options)
    assert page.read_text() == "the committed page\n"
    if kind == "missing":
        assert read_rows(rows) == {}  # a run may start the folder: only the page needs rows


def test_a_study_left_running_by_a_killed_run_reads_interrupted(tmp_path):
    """A run killed outright leaves its point "running"; read after it (the zoo's lock says no
    run holds the folder), the row is interrupted, to resume: not an internal error."""
    entry = ZooEntry(name="resnet18", family="resnet")
    point = zoo_point(entry, ZooOptions(data=tmp_path, out=tmp_path), "cuda")
    folder = tmp_path / point.folder_name
    folder.mkdir()
    (folder / POINT_FILE).write_text(
        f'{{"folder": "{point.folder_name}", "settings": {point.model_dump_json()}, '
        '"argv": ["q"], "status": "running", "attempts": 1, "host": "h", "started_utc": "t"}'
    )
    row = collect_row(entry, folder)
    assert row.status == RowStatus.INTERRUPTED and row.error is None
