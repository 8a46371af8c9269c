"""`bench speed`'s tables read each x through `report/claims.py`: every x of the committed speed
records whose [q1, q3] contains 1.0 is marked not settled in the record's table and in the
summary of every measured x, and the estimators are stated under each table."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantstudy.bench.report import render_folder
from quantstudy.bench.schema import SpeedBench, read_record
from quantstudy.report.claims import NOT_SETTLED, claim_of

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

pytestmark = pytest.mark.committed("docs/results")


def test_every_unsettled_x_of_the_speed_records_is_marked():
    report = render_folder(RESULTS)
    unsettled = 0
    for path in sorted(RESULTS.glob("speed-*.json")):
        record = read_record(path)
        assert isinstance(record, SpeedBench)
        for r in record.results:
            for e in r.engines:
                for b in e.speed.batches if e.speed is not None else []:
                    claim = claim_of(b)
                    x = f"{b.ratio.median:.2f} [{b.ratio.q1:.2f}-{b.ratio.q3:.2f}]"
                    rows = [line for line in report.split("\n") if f"| {x}" in line
                            and line.startswith(f"| {r.model} |")]  # fmt: skip
                    assert rows, (path.name, r.model, b.batch)
                    if not claim.settled:
                        unsettled += 1
                        assert any(f"{x} ({NOT_SETTLED}" in line for line in rows), path.name
    assert unsettled  # the committed records hold some (crossvit_9_240's promote128 run)
    assert report.count("need not equal x") >= 1 and "the engine's ms" in report
