"""`bench/peers/summary.py`: the peers record's short table, from a committed record."""

from pathlib import Path

import pytest

from quantstudy.bench.peers.summary import summary_table
from quantstudy.bench.schema import PeersBench, read_record
from quantstudy.record.vocab import PeerFamily

ROOT = Path(__file__).resolve().parents[2]
RECORD = "docs/results/peers-h100-760cbc9-vit-fast.json"

pytestmark = pytest.mark.committed(RECORD)


def _record() -> PeersBench:
    record = read_record(ROOT / RECORD)
    assert isinstance(record, PeersBench)
    return record


def test_a_line_per_model_with_our_engines_torchaos_best_and_our_lead():
    record = _record()
    (row,) = record.results
    x = {e.name: {b.batch: b.ratio.median for b in e.speed.batches} for e in row.engines if e.speed}
    torchao = {n: v for n, v in x.items() if n.startswith("torchao ")}
    best = {b: max(v[b] for v in torchao.values()) for b in (1, 128)}
    ours = {b: max(x["quantstudy fused"][b], x["quantstudy fastest"][b]) for b in (1, 128)}
    head, rule, line = summary_table(record)
    assert head.startswith("| model (recipe) | quantstudy fused x at 1 / 128 |") and "---" in rule
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == f"{row.model} ({row.recipe})"
    assert cells[1] == f"{x['quantstudy fused'][1]:.2f} / {x['quantstudy fused'][128]:.2f}"
    assert cells[3].startswith(f"{best[1]:.2f} / {best[128]:.2f} (")
    assert cells[4] == f"{ours[1] / best[1] - 1:+.0%} / {ours[128] / best[128] - 1:+.0%}"


def test_a_model_torchao_refused_says_so():
    record = _record()
    (row,) = record.results
    mine = [e for e in row.engines if e.family != PeerFamily.TORCHAO]
    refused = record.model_copy(update={"results": [row.model_copy(update={"engines": mine})]})
    *_, line = summary_table(refused)
    assert line.endswith("| refused | - |")
