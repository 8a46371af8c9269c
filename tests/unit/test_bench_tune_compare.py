"""`quantstudy bench tune-compare`: two products records tuned two ways, compared column by
column, and their tuning logs added up. On the committed bound records of the H100 at 171574a,
the figures docs/fp8-kernel.md quotes."""

import json
from pathlib import Path

import pytest

from quantstudy.bench.schema import read_record
from quantstudy.bench.tune_compare import column_ratios, read_log
from quantstudy.cli import main

RESULTS = Path(__file__).parents[2] / "docs/results"
ALL = RESULTS / "products-h100-171574a-bound-all.json"
SIX = RESULTS / "products-h100-171574a-bound-6.json"
pytestmark = pytest.mark.committed("docs/results", "docs/fp8-kernel.md")
COMPARE = ["bench", "tune-compare"]


def test_the_bounds_cost_per_column_is_what_the_docs_say(capsys):
    ratios = column_ratios(read_record(ALL), read_record(SIX))
    assert len(ratios) == 110  # every column of ours the cut unbounded run reached
    worst = max(ratios, key=lambda r: r[2])
    assert worst[:2] == ("matmul b128 25216x3072x768", "ours") and round(worst[2], 3) == 1.166
    assert main([*COMPARE, str(ALL), str(SIX), "--worst", "1"]) == 0
    printed = capsys.readouterr().out
    assert "110 columns both timed: B/A time 1.009 (geometric mean), 0.935 to 1.166" in printed
    page = " ".join((Path(__file__).parents[2] / "docs/fp8-kernel.md").read_text().split())
    assert "110 columns of ours both timed, our product took 0.9% longer" in page
    assert "(geometric mean; 0.935 to 1.166," in page


def test_the_logs_add_up_over_all_launches_and_those_both_tuned(tmp_path, capsys):
    """A run cut by its budget tunes fewer launches: the shared ones are compared alike; a line
    cut by a killed run is skipped."""
    launch = {"kernel": "fp8_gemm", "M": 197, "N": 768, "K": 768}
    full = {"configs": 30, "screened": 0, "finalists": 30, "compile_s": 4.0, "tune_s": 2.0}
    screened = {"configs": 30, "screened": 30, "finalists": 3, "compile_s": 4.0, "tune_s": 0.5}
    other = launch | {"M": 25216}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(launch | full | {"tile": "x"}) + "\n")
    b.write_text(
        "\n".join(json.dumps(r) for r in (launch | screened | {"tile": "y"}, other | screened))
        + '\n{"kernel": "fp8_g'
    )
    assert len(read_log(b)) == 2
    assert main([*COMPARE, str(ALL), str(SIX), "--worst", "0", "--logs", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == (
        "A tuning, all 1 launches: 30 configs compiled, 0 screened, 30 timed in full; compile "
        "4.0 s, timing 2.0 s; the 1 both tuned 1 launches: 30 configs compiled, 0 screened, "
        "30 timed in full; compile 4.0 s, timing 2.0 s"
    )
    assert out[-1].startswith("B tuning, all 2 launches: 60 configs compiled, 60 screened, 6")
    assert out[-1].endswith("the 1 both tuned 1 launches: 30 configs compiled, 30 screened, "
                            "3 timed in full; compile 4.0 s, timing 0.5 s")  # fmt: skip


def test_a_file_that_is_not_a_products_record_or_log_is_one_line(tmp_path, capsys):
    peers = RESULTS / "peers-h100-995cd5b-vit.json"
    assert main([*COMPARE, str(ALL), str(peers)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"quantstudy: error: {peers} is a peers record, not a products record"
    assert main([*COMPARE, str(tmp_path / "nope.json"), str(SIX)]) == 1
    assert "cannot read" in capsys.readouterr().err
    missing = tmp_path / "a.jsonl"
    assert main([*COMPARE, str(ALL), str(SIX), "--logs", str(missing), str(missing)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"quantstudy: error: cannot read {missing}: No such file or directory"
