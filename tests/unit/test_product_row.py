"""A products record's rows say how each of our variants summed (`bench/product_row.py`), so
each is judged against cuBLASLt's column that sums alike."""

import json
from pathlib import Path

import pytest

from quantstudy.bench.schema import ProductsBench, read_record

RECORD = Path(__file__).parents[2] / "docs/results/products-h100-569da34-handoff.json"

pytestmark = pytest.mark.committed("docs/results/products-h100-569da34-handoff.json")


def _record(tmp_path: Path, switches: str | None, ours_promote: int | None) -> ProductsBench:
    """The committed record's first row, timed alike, under `switches` and `ours_promote`."""
    raw = json.loads(RECORD.read_text())
    raw["provenance"]["lab_switches"] = switches
    row = raw["results"][0]
    row["us"] = {"cuBLASLt": 110.0, "cuBLASLt fast-accum": 100.0, "ours": 120.0}
    row["us"]["ours promote128"] = 130.0
    row["best_ours"], row["ours_promote"] = "ours", ours_promote
    raw["results"] = [row]
    path = tmp_path / "record.json"
    path.write_text(json.dumps(raw))
    record = read_record(path)
    assert isinstance(record, ProductsBench)
    return record


@pytest.mark.parametrize(
    ("switches", "ours_promote", "alike", "ratio"),
    [
        (None, None, "cuBLASLt", 110 / 120),  # an older record: its engines promoted
        ("QUANTSTUDY_FP8_PROMOTE=0", None, "cuBLASLt fast-accum", 100 / 120),  # run switched
        (None, 0, "cuBLASLt fast-accum", 100 / 120),  # the row says so
        ("QUANTSTUDY_FP8_PROMOTE=0", 128, "cuBLASLt", 110 / 120),  # the row over the switch
    ],
)
def test_ours_is_judged_against_cublaslt_summing_alike(
    tmp_path, switches, ours_promote, alike, ratio
):
    (row,) = _record(tmp_path, switches, ours_promote).results
    assert row.cublaslt_alike == alike
    assert row.best_over_cublaslt == pytest.approx(ratio)
    assert row.promote_of("ours promote128") == 128 and row.promote_of("ours fast-accum") == 0


def test_the_reader_s_default_is_not_written(tmp_path):
    """The interval read from the provenance stays out of the record when written again."""
    record = _record(tmp_path, "QUANTSTUDY_FP8_PROMOTE=0", None)
    assert "ours_promote" not in record.results[0].model_dump(exclude_none=True)
    assert record.results[0].promote_of("ours") == 0
