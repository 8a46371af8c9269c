"""`quantstudy bench bound-check`: where each tuned winner of a products record ranks in the
order a `QUANTSTUDY_GEMM_CONFIGS` bound keeps configs (`tiles.ranked`)."""

from pathlib import Path

from _interpreter import require_triton

from quantstudy.bench.bound_check import winner_ranks
from quantstudy.bench.schema import read_record, write_record
from quantstudy.cli import main

RECORD = Path(__file__).parents[2] / "docs/results/products-h100-569da34-handoff.json"


def test_each_winner_is_ranked_as_the_bound_keeps_configs(tmp_path, capsys):
    require_triton()
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.quant.kernels.tiles import config_words, prune_gemm, ranked

    record = read_record(RECORD)
    assert main(["bench", "bound-check", str(RECORD)]) == 1  # older than ProductRow.tiles
    assert "names no tuned tile" in capsys.readouterr().err  # said, not guessed
    row = record.results[0]  # 25216 x 768 x 2304: every descriptor path allowed
    named = {"M": row.m, "N": row.n, "K": row.k, "PROMOTE": 128}
    named |= {"tma_loads_ok": 1, "tma_store_ok": 1}
    order = ranked(prune_gemm(FP8_GEMM.configs, named), named)
    third, persistent = config_words(order[2]), "128x256x128 w8 s3 tma-loads persistent sub"
    tiled = row.model_copy(update={"tiles": {"ours": third, "ours fp8-out": persistent}})
    path = tmp_path / "tiled.json"
    write_record(path, record.model_copy(update={"results": [tiled]}))
    assert winner_ranks(read_record(path)) == [
        ("b128 25216x768x2304 ours", third, 3),
        ("b128 25216x768x2304 ours fp8-out", persistent, None),  # not timed when promoting
    ]
    assert main(["bench", "bound-check", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "2 winners, 1 outside the ranking" in printed and "   2: 0 of 2" in printed
    assert "   4: 1 of 2" in printed


def test_a_record_of_another_kind_is_one_line(capsys):
    peers = RECORD.parent / "peers-h100-995cd5b-vit.json"
    assert main(["bench", "bound-check", str(peers)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"quantstudy: error: {peers} is a peers record, not a products record"
