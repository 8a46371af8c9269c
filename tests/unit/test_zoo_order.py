"""zoo/order.py: a run starts its longest expected studies first, from the committed rows."""

from types import SimpleNamespace

from quantstudy.zoo.board import ZooRow
from quantstudy.zoo.order import longest_first


def _job(model: str) -> SimpleNamespace:
    config = SimpleNamespace(model=model)
    return SimpleNamespace(folder=f"{model}-default", point=SimpleNamespace(config=config))


def _row(model: str, wall_s: float | None, study_s: float | None = None) -> ZooRow:
    return ZooRow(
        model=model, family="f", folder=f"{model}-default", wall_s=wall_s, study_s=study_s
    )


def test_longest_expected_first_unknown_at_the_median_ties_in_list_order():
    jobs = [_job(m) for m in ("small", "new", "big", "mid", "other_new", "own_total")]
    rows = {
        "small": _row("small", 50.0),
        "big": _row("big", 300.0),
        "mid": _row("mid", 120.0),
        "own_total": _row("own_total", None, study_s=200.0),  # no process time: its own total
    }  # median of 50, 120, 200, 300 is 160: the two without a row go between 200 and 120
    order = [j.point.config.model for j in longest_first(jobs, rows)]  # type: ignore[arg-type]
    assert order == ["big", "own_total", "new", "other_new", "mid", "small"]


def test_without_rows_the_list_order_stays():
    jobs = [_job(m) for m in ("a", "b", "c")]
    assert longest_first(jobs, {}) == jobs  # type: ignore[arg-type]
