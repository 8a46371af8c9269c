"""The sweep's summary reads each x through `report/claims.py`: an x whose [q1, q3] contains
1.0 is marked not settled in the studies table and never chosen as a model's best, the
estimators are stated under the table, and an older sweep.json (x without its engines'
medians) still reads."""

from __future__ import annotations

from quantstudy.report.claims import NOT_SETTLED
from quantstudy.sweep.markdown import render_markdown
from quantstudy.sweep.summary import BatchX, SweepRow, SweepSummary, best_per_model


def _row(recipe: str, x: BatchX) -> SweepRow:
    return SweepRow(
        folder=f"m-{recipe}", model="m", weights="random", recipe=recipe, calibrator="max",
        seed=0, fp8_kernel="fused", status="complete", x=[x], agreement=0.99, decision="ship",
    )  # fmt: skip


STRADDLES = BatchX(batch=128, median=1.10, q1=0.91, q3=1.17, fp16_ms=4.584, fp8_ms=4.631)
SETTLED = BatchX(batch=128, median=1.05, q1=1.04, q3=1.06)


def test_an_unsettled_x_is_marked_and_never_the_best():
    rows = [_row("fast", STRADDLES), _row("sure", SETTLED)]
    (best,) = best_per_model(rows)
    assert best.folder == "m-sure" and "1 more, x not settled" in best.why
    (none,) = best_per_model([_row("fast", STRADDLES)])
    assert none.folder is None and "has a settled x" in none.why
    md = render_markdown(
        SweepSummary(sweep_file="s.yaml", executor="local", device="cuda",
                     counts={"complete": 2}, rows=rows, best=[best], plots={})
    )  # fmt: skip
    assert f"1.100 (0.910-1.170) ({NOT_SETTLED}, ms ratio disagrees)" in md
    assert "| 1.050 (1.040-1.060) |" in md
    assert "need not equal x" in md


def test_an_older_sweep_row_reads_and_is_marked_from_its_interval():
    old = BatchX.model_validate({"batch": 1, "median": 1.0, "q1": 0.98, "q3": 1.02})
    assert old.fp16_ms is None and not old.claim().settled
