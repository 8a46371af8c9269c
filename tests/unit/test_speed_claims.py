"""What an x may claim (`report/claims.py`) and the study report's self-check of it
(`report/selfcheck_x.py`): an x whose [q1, q3] contains 1.0 is marked not settled in every
table of the report, its fraction of the ideal is withheld, and a table that shows it as
settled fails the check, table by table."""

from __future__ import annotations

import math

import pytest
from _records import build_record

from quantstudy.record import IdealSpeed, StudyRecord, TimingStats
from quantstudy.report.claims import DISAGREES, NOT_MEASURED_X, NOT_SETTLED, XClaim
from quantstudy.report.markdown import render_markdown
from quantstudy.report.selfcheck import check_markdown

HRNET_128 = XClaim(x=1.1019, q1=0.9122, q3=1.1697, fp16_ms=4.5845, fp8_ms=4.6311)


def test_an_interval_that_contains_one_is_not_settled_and_says_why():
    assert not HRNET_128.settled
    assert HRNET_128.estimators_disagree  # 4.584 / 4.631 < 1 < 1.10
    assert HRNET_128.cell("1.10 [0.91, 1.17]") == f"1.10 [0.91, 1.17] ({NOT_SETTLED}, {DISAGREES})"
    assert any("contains 1.0" in s for s in HRNET_128.sentences())
    settled = XClaim(x=1.17, q1=1.16, q3=1.18, fp16_ms=6.5, fp8_ms=5.55)
    assert settled.settled and not settled.tags() and settled.cell("1.17") == "1.17"


def test_a_nan_x_reads_not_measured_never_nan():
    nan = XClaim(x=math.nan, q1=1.05, q3=1.06)
    assert not nan.measured and not nan.settled
    assert nan.cell("nan [1.05, 1.06]") == NOT_MEASURED_X
    assert nan.ideal(1.2) == f"x {NOT_SETTLED}"


def test_the_ideal_fraction_is_of_the_same_x_never_over_100_percent_nor_for_an_unsettled_x():
    assert HRNET_128.ideal(1.1474) == f"x {NOT_SETTLED}"
    assert XClaim(x=1.2, q1=1.19, q3=1.21).ideal(1.5) == "80% of 1.50"
    over = XClaim(x=1.3, q1=1.29, q3=1.31).ideal(1.25)
    assert over is not None and "%" not in over and "over the ideal" in over
    assert XClaim(x=1.2, q1=1.19, q3=1.21).ideal(None) is None


def test_noisy_engines_and_few_rounds_are_marked():
    claim = XClaim(x=1.2, q1=1.1, q3=1.3, fp16_spread=0.08, fp8_spread=0.01, rounds=3)
    assert claim.tags() == ["noisy fp16", "few rounds"]


def _stats(median: float, q1: float, q3: float) -> TimingStats:
    return TimingStats(median=median, q1=q1, q3=q3, min=q1, max=q3, n=30)


def _unsettled_record() -> StudyRecord:
    """The fixture study with batch 1's x straddling 1.0 (FP8's median the slower, as
    hrnet_w18_small's batch 128), the ideal x table at every batch, and its variant's batch 1
    straddling too."""
    record = build_record()
    sp = record.speed
    assert sp is not None
    first = sp.batches[0]
    fp16 = first.fp16_ms.median
    straddle = first.model_copy(
        update={
            "ratio": _stats(1.10, 0.91, 1.17),
            "fp8_ms": _stats(fp16 * 1.01, fp16, fp16 * 1.02),
            "warnings": ["these rounds do not support the sign of the gain"],
        }
    )
    batches = [straddle, *sp.batches[1:]]
    ideal = [
        IdealSpeed(batch=b.batch, peaks="test peaks", layers=3, fp16_products_us=10.0,
                   fp16_elementwise_us=2.0, fp8_roofline_us=5.0, fp16_ms=b.fp16_ms.median,
                   ideal_x=1.25, measured_x=b.ratio.median, fraction=b.ratio.median / 1.25)
        for b in batches
    ]  # fmt: skip
    variant = record.variants[0]
    vspeed = [straddle, *(variant.speed or [])[1:]]
    return record.model_copy(
        update={
            "speed": sp.model_copy(update={"batches": batches, "ideal": ideal}),
            "variants": [variant.model_copy(update={"speed": vspeed})],
        }
    )


@pytest.fixture(scope="module")
def unsettled() -> tuple[StudyRecord, str]:
    record = _unsettled_record()
    return record, render_markdown(record)


def _row(md: str, starts: str, header: str) -> str:
    """The line of the table headed by a line containing `header` that starts with `starts`."""
    lines = md.split("\n")
    top = next(i for i, line in enumerate(lines) if line.startswith("|") and header in line)
    return next(line for line in lines[top:] if line.startswith(starts))


def test_the_report_marks_the_unsettled_x_in_every_table_and_passes(unsettled):
    record, md = unsettled
    assert check_markdown(md, record) == []
    speed = _row(md, "| 1 |", "x median [q1, q3] | Rounds")
    assert f"1.10 [0.91, 1.17] ({NOT_SETTLED}, {DISAGREES})" in speed
    ideal = _row(md, "| 1 |", "fraction of ideal")
    assert ideal.endswith(f"| x {NOT_SETTLED} |") and "%" not in ideal
    variant = _row(md, "| depthwise_too |", "| Variant |")
    assert f"batch 1: 1.10 [0.91, 1.17] ({NOT_SETTLED}" in variant
    assert "need not equal x" in md  # the estimators, stated under the speed table
    assert f"x 1.10 (q1 0.91, q3 1.17; {NOT_SETTLED}" in md  # the summary's sentence


@pytest.mark.parametrize(
    ("table", "header"),
    [
        ("speed", "x median [q1, q3] | Rounds"),
        ("ideal x", "fraction of ideal"),
        ("variants", "| Variant |"),
    ],
)
def test_a_table_that_shows_the_unsettled_x_as_settled_fails_the_check(unsettled, table, header):
    record, md = unsettled
    start = "| depthwise_too |" if table == "variants" else "| 1 |"
    line = _row(md, start, header)
    settled = line.replace(f" ({NOT_SETTLED}, {DISAGREES})", "").replace(f" ({NOT_SETTLED})", "")
    settled = settled.replace(f"x {NOT_SETTLED}", "88.00%")
    assert settled != line
    problems = check_markdown(md.replace(line, settled), record)
    assert any("as settled" in p and "do not support the sign" in p for p in problems), problems


def test_a_record_whose_rounds_settle_every_x_renders_no_mark():
    record = build_record(speedup={1: 1.3, 32: 1.3, 128: 1.3}, noise=0.005)
    md = render_markdown(record)
    assert NOT_SETTLED not in md and check_markdown(md, record) == []
