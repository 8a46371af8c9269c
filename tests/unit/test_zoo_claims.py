"""The zoo page, CSV and plot carry each row's speed warnings (`report/claims.py`): an x whose
[q1, q3] contains 1.0 is marked not settled, not ranked and out of the family lines, with no
fraction of the ideal; the page's self-check (`zoo/page_check.py`) fails a page that shows it
otherwise. On the committed rows: hrnet_w18_small at batch 128 (x 1.10 [0.91, 1.17], its fp16
median below its FP8 median)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest

from quantstudy.report.claims import NOT_MEASURED_X, NOT_SETTLED
from quantstudy.report.render import ReportCheckError
from quantstudy.zoo.board import LEADERBOARD_VERSION, Leaderboard, Provenance, ZooBatch, ZooRow
from quantstudy.zoo.markdown import render_markdown, render_unchecked
from quantstudy.zoo.page_check import check_page
from quantstudy.zoo.render import family_medians, ranked, render_csv
from quantstudy.zoo.row_files import read_rows

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "docs" / "results" / "zoo"
PAGE = REPO / "docs" / "results" / "zoo.md"

pytestmark = pytest.mark.committed("docs/results/zoo", "docs/results/zoo.md")


def _board(rows: list[ZooRow]) -> Leaderboard:
    provenance = Provenance(
        command=["quantstudy", "zoo"], created_utc="-", models_file="models.yaml",
        models_sha256="0" * 64, shard="1/1", weights="random", device="cuda", driver={},
        environments=[],
    )  # fmt: skip
    return Leaderboard(
        provenance=provenance,
        batches=sorted({b.batch for r in rows for b in r.batches}),
        counts={"complete": len(rows)},
        rows=rows,
    )


@pytest.fixture(scope="module")
def board() -> Leaderboard:
    return _board(list(read_rows(ROWS).values()))


def _line(md: str, model: str) -> str:
    return next(line for line in md.split("\n") if line.startswith(f"| {model} |"))


def test_hrnet_at_128_is_not_settled_unranked_and_out_of_the_family_line(board):
    hrnet = next(r for r in board.rows if r.model == "hrnet_w18_small")
    at = hrnet.at(128)
    assert at is not None and at.x_q1 < 1.0 < at.x_q3 and at.fp16_ms < at.fp8_ms
    md = render_markdown(board)
    cells = [c.strip() for c in _line(md, "hrnet_w18_small").split("|")]
    assert f"1.10 [0.91, 1.17] ({NOT_SETTLED}, ms ratio disagrees)" in cells
    assert f"x {NOT_SETTLED}" in cells and not any("%" in c for c in cells)
    assert "hrnet (" not in next(x for x in md.split("\n") if x.startswith("Median x at batch"))
    assert "family medians: " in md and "hrnet_w18_small" in md.split("family medians: ")[1]
    assert all(f != "hrnet" for f, _, _ in family_medians(board.rows, 128))
    order = [r.model for r in ranked(board.rows, 128) if r.at(128) is not None]
    settled = [m for m in order if m not in ("hrnet_w18_small", "regnety_016")]
    assert order[: len(settled)] == settled  # every settled row ranks above the unsettled
    assert "need not equal x" in md  # the estimators, stated under the table
    assert check_page(md, board) == []


def test_the_committed_page_shows_hrnet_not_settled():
    md = PAGE.read_text()
    assert f"({NOT_SETTLED}, ms ratio disagrees)" in _line(md, "hrnet_w18_small")
    assert check_page(md, _board(list(read_rows(ROWS).values()))) == []


def test_the_csv_holds_the_warnings(board):
    rows = {r["model"]: r for r in csv.DictReader(io.StringIO(render_csv(board)))}
    hrnet = rows["hrnet_w18_small"]
    assert hrnet["x_settled_b128"] == "False" and hrnet["ideal_fraction_b128"] == ""
    assert "contains 1.0" in hrnet["warnings_b128"]
    assert "on the other side of 1.0" in hrnet["warnings_b128"]
    assert hrnet["x_settled_b1"] == "True" and hrnet["warnings_b1"] == ""


def test_a_row_keeps_its_studys_warnings_and_an_older_row_still_reads(board):
    assert LEADERBOARD_VERSION >= 6
    older = next(r for r in board.rows if r.model == "hrnet_w18_small")
    assert older.at(128).warnings is None  # type: ignore[union-attr]  # written before 6
    kept = ZooBatch(batch=128, fp16_ms=5.0, fp8_ms=4.0, x=1.25, x_q1=1.2, x_q3=1.3,
                    warnings=["fp16 timings are noisy: IQR/median 7.0% exceeds 5%"],
                    fp16_spread=0.07, fp8_spread=0.01, rounds=30)  # fmt: skip
    row = ZooRow(model="m", family="f", folder="-", status="complete", batches=[kept])
    again = ZooRow.model_validate(row.model_dump(mode="json", exclude_defaults=True))
    assert again == row
    md = render_markdown(_board([row]))
    assert "1.25 [1.20, 1.30] (noisy fp16)" in _line(md, "m")
    (csv_row,) = csv.DictReader(io.StringIO(render_csv(_board([row]))))
    assert csv_row["warnings_b128"] == kept.warnings[0]  # type: ignore[index]


@pytest.mark.parametrize("tamper", ["mark", "ideal", "rank", "family"])
def test_a_page_that_shows_the_unsettled_x_as_settled_fails_the_check(board, tamper):
    md = render_unchecked(board)
    line = _line(md, "hrnet_w18_small")
    if tamper == "mark":
        bad = md.replace(line, line.replace(f" ({NOT_SETTLED}, ms ratio disagrees)", ""))
    elif tamper == "ideal":
        bad = md.replace(line, line.replace(f"x {NOT_SETTLED}", "96% of 1.15"))
    elif tamper == "rank":
        first = _line(md, "cspresnet50")
        bad = md.replace(line + "\n", "").replace(first, line + "\n" + first)
    else:
        bad = md.replace("least regnet (1.03, 1 model)", "least regnet (1.01, 2 models)")
    assert bad != md
    assert check_page(bad, board), tamper


def test_an_unsettled_x_without_an_ideal_renders_and_passes_the_check():
    """No ideal (the CPU, an unknown GPU): the ideal cell is "-", no fraction is claimed, and
    the page's check passes it; a percentage put there still fails."""
    at = ZooBatch(batch=128, fp16_ms=5.0, fp8_ms=4.9, x=1.02, x_q1=0.97, x_q3=1.06)
    row = ZooRow(model="m", family="f", folder="-", status="complete", batches=[at])
    md = render_markdown(_board([row]))  # raised before: "-" read as a settled fraction
    line = _line(md, "m")
    assert f"1.02 [0.97, 1.06] ({NOT_SETTLED})" in line and "| - |" in line
    assert check_page(md, _board([row])) == []
    priced = row.model_copy(update={"batches": [at.model_copy(update={"ideal_x": 1.5})]})
    shown = render_markdown(_board([priced]))
    assert check_page(shown.replace(f"x {NOT_SETTLED}", "68% of 1.50"), _board([priced]))


def test_a_nan_x_reads_not_measured():
    nan = ZooBatch(batch=128, fp16_ms=5.0, fp8_ms=4.0, x=math.nan, x_q1=1.05, x_q3=1.06)
    row = ZooRow(model="m", family="f", folder="-", status="complete", batches=[nan])
    md = render_markdown(_board([row]))
    assert "nan" not in _line(md, "m") and NOT_MEASURED_X in _line(md, "m")
    (csv_row,) = csv.DictReader(io.StringIO(render_csv(_board([row]))))
    assert csv_row["x_b128"] == "" and csv_row["x_settled_b128"] == ""


def test_render_refuses_a_page_that_fails_its_check(board, monkeypatch):
    import quantstudy.zoo.markdown as page

    monkeypatch.setattr(page, "_x", lambda row, batch: "1.00 [1.00, 1.00]")
    with pytest.raises(ReportCheckError, match="as settled"):
        render_markdown(board)
