"""The peers record in one short table, a line per model: what the README quotes.

Per model, the median x at each batch of our engines (`fused`, `fastest`, whatever the row
timed) and of torchao's best config at that batch, and how far our best engine is ahead of
torchao's best (negative: behind). A cell the row did not time is a dash; a model torchao
refused entirely says so. Every figure is a field of the record, as in `table.py`'s full table.
"""

from __future__ import annotations

from quantstudy.bench.peers.configs import LABEL
from quantstudy.bench.schema import PeerEngine, PeersBench, PeersResult
from quantstudy.record.vocab import PeerFamily
from quantstudy.report.format import table


def summary_table(rec: PeersBench) -> list[str]:
    """One line per model: our engines' x, torchao's best x, our lead over it, per batch."""
    ours = list(dict.fromkeys(e.name for r in rec.results for e in r.engines if _ours(e)))
    batches = " / ".join(str(b) for b in rec.batches)
    head = [
        "model (recipe)",
        *(f"{name} x at {batches}" for name in ours),
        f"best torchao x at {batches}",
        "our best engine ahead of it",
    ]
    return table(head, [_line(rec.batches, ours, r) for r in rec.results])


def _line(batches: list[int], ours: list[str], r: PeersResult) -> list[str]:
    by_name = {e.name: _medians(e) for e in r.engines}
    cells = [" / ".join(_fmt(by_name.get(name, {}).get(b)) for b in batches) for name in ours]
    theirs = [e for e in r.engines if e.family == PeerFamily.TORCHAO and e.speed is not None]
    if not theirs:
        return [f"{r.model} ({r.recipe})", *cells, "refused", "-"]
    best_theirs: list[tuple[float, str] | None] = []
    leads = []
    for b in batches:
        timed = [(x, e.name.removeprefix(LABEL)) for e in theirs if (x := _medians(e).get(b))]
        best = max(timed, default=None)
        best_theirs.append(best)
        mine = [x for name in ours if (x := by_name.get(name, {}).get(b)) is not None]
        leads.append(f"{max(mine) / best[0] - 1:+.0%}" if best and mine else "-")
    names = list(dict.fromkeys(best[1] for best in best_theirs if best))
    xs = " / ".join(_fmt(best[0] if best else None) for best in best_theirs)
    return [f"{r.model} ({r.recipe})", *cells, f"{xs} ({', '.join(names)})", " / ".join(leads)]


def _ours(e: PeerEngine) -> bool:
    return e.family == PeerFamily.QUANTSTUDY


def _medians(e: PeerEngine) -> dict[int, float]:
    """The engine's median x by batch; none for the fp16 engine."""
    return {b.batch: b.ratio.median for b in e.speed.batches} if e.speed is not None else {}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
