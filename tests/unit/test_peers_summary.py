"""`bench/peers/summary.py`: the peers record's short table, from a committed record."""

from pathlib import Path

import pytest

from quantstudy.bench.peers.summary import summary_table
from quantstudy.bench.schema import PeersBench, read_record
from quantstudy.record import BatchSpeed
from quantstudy.record.vocab import PeerProvider
from quantstudy.report.claims import NOT_SETTLED

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
    head, rule, line, blank, estimator = summary_table(record)
    assert head.startswith("| model (recipe) | quantstudy fused x at 1 / 128 |") and "---" in rule
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == f"{row.model} ({row.recipe})"
    assert cells[1] == f"{x['quantstudy fused'][1]:.2f} / {x['quantstudy fused'][128]:.2f}"
    assert cells[3].startswith(f"{best[1]:.2f} / {best[128]:.2f} (")
    assert cells[4] == f"{ours[1] / best[1] - 1:+.0%} / {ours[128] / best[128] - 1:+.0%}"
    assert blank == "" and estimator.startswith("x is the median over round pairs")


def test_an_older_record_s_engine_family_reads_as_its_provider():
    """A peers engine's builder is its `provider`; a record written when it was called `family`
    (the committed records before their key was renamed) reads the same (a family is a
    model's), and is written back under the new name."""
    raw = (ROOT / RECORD).read_text()
    old = raw.replace('"provider": ', '"family": ')
    assert '"family": "torchao"' in old and '"provider"' not in old
    record = PeersBench.model_validate_json(old)
    assert record == _record()
    (row,) = record.results
    said = {e.name: e.provider for e in row.engines}
    assert said["fp16"] == PeerProvider.FP16 and said["quantstudy fused"] == PeerProvider.QUANTSTUDY
    assert {p for n, p in said.items() if n.startswith("torchao ")} == {PeerProvider.TORCHAO}
    again = record.model_dump_json()
    assert '"provider":"torchao"' in again and '"family"' not in again


def test_a_model_torchao_refused_says_so():
    record = _record()
    (row,) = record.results
    mine = [e for e in row.engines if e.provider != PeerProvider.TORCHAO]
    refused = record.model_copy(update={"results": [row.model_copy(update={"engines": mine})]})
    line = summary_table(refused)[2]
    assert line.endswith("| refused | - |")


def _straddling(b: BatchSpeed) -> BatchSpeed:
    """`b` with its x straddling 1.0 (its rounds no longer support the sign of the gain)."""
    return b.model_copy(update={"ratio": b.ratio.model_copy(update={"q1": 0.9, "q3": 1.6})})


def test_an_unsettled_x_is_marked_and_is_never_best_nor_ahead():
    """torchao's static engine's x straddles 1.0 at batch 128: its cell is marked and the best
    torchao x there is the next settled one; our fastest straddles at 1: the lead there is of
    fused alone."""
    record = _record()
    (row,) = record.results

    def straddle(e, batch: int):
        batches = [_straddling(b) if b.batch == batch else b for b in e.speed.batches]
        return e.model_copy(update={"speed": e.speed.model_copy(update={"batches": batches})})

    engines = [
        straddle(e, 128) if e.name == "torchao static per-tensor"
        else straddle(e, 1) if e.name == "quantstudy fastest" else e
        for e in row.engines
    ]  # fmt: skip
    changed = record.model_copy(update={"results": [row.model_copy(update={"engines": engines})]})
    x = {e.name: {b.batch: b.ratio.median for b in e.speed.batches} for e in engines if e.speed}
    others = [v for n, v in x.items() if n.startswith("torchao ") and "static" not in n]
    settled_128 = max(v[128] for v in others)
    _, _, line, _, estimator = summary_table(changed)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2].startswith(f"{x['quantstudy fastest'][1]:.2f} ({NOT_SETTLED})")
    best_1 = max(v[1] for n, v in x.items() if n.startswith("torchao "))
    assert cells[3].startswith(f"{best_1:.2f} / {settled_128:.2f} (")
    lead_1 = x["quantstudy fused"][1] / best_1 - 1
    assert cells[4].startswith(f"{lead_1:+.0%} / ")
    assert f"*{NOT_SETTLED}*" in estimator


def test_the_full_table_marks_an_unsettled_x_and_withholds_its_fraction_of_the_ideal():
    from quantstudy.bench.peers.table import peers_table

    record = _record()
    (row,) = record.results
    fused = next(e for e in row.engines if e.name == "quantstudy fused")
    batches = [_straddling(b) if b.batch == 128 else b for b in fused.speed.batches]
    changed_fused = fused.model_copy(
        update={"speed": fused.speed.model_copy(update={"batches": batches})}
    )
    engines = [changed_fused if e is fused else e for e in row.engines]
    changed = record.model_copy(update={"results": [row.model_copy(update={"engines": engines})]})
    line = next(x for x in peers_table(changed) if "| quantstudy fused |" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4].endswith(f"({NOT_SETTLED})") and not cells[3].endswith(f"({NOT_SETTLED})")
    assert cells[6].endswith(f"(x {NOT_SETTLED})") and cells[5].endswith("%)")
