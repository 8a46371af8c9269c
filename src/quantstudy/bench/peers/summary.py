"""The peers record in one short table, a line per model: what the README quotes.

Per model, the median x at each batch of our engines (`fused`, `fastest`, whatever the row
timed) and of torchao's best config at that batch, and how far our best engine is ahead of
torchao's best (negative: behind). A cell the row did not time is a dash; a model torchao
refused entirely says so. Every figure is a field of the record, as in `table.py`'s full table.

Each x is read through `report/claims.py`: one whose [q1, q3] contains 1.0 is marked "not
settled" and takes no part in "best" or "ahead" (where no engine's x at a batch is settled,
the cell says so); the estimator is stated under the table.
"""

from __future__ import annotations

from quantstudy.bench.peers.configs import LABEL
from quantstudy.bench.schema import PeerEngine, PeersBench, PeersResult
from quantstudy.record.vocab import PeerProvider
from quantstudy.report.claims import NOT_SETTLED, XClaim, claim_of, legend
from quantstudy.report.format import table


def summary_table(rec: PeersBench) -> list[str]:
    """One line per model: our engines' x, torchao's best x, our lead over it, per batch; then
    the estimator and the marks the table uses."""
    ours = list(dict.fromkeys(e.name for r in rec.results for e in r.engines if _ours(e)))
    batches = " / ".join(str(b) for b in rec.batches)
    head = [
        "model (recipe)",
        *(f"{name} x at {batches}" for name in ours),
        f"best torchao x at {batches}",
        "our best engine ahead of it",
    ]
    claims = [c for r in rec.results for e in r.engines for c in _claims(e).values()]
    lines = table(head, [_line(rec.batches, ours, r) for r in rec.results])
    return [*lines, "", *legend(claims, ms_shown=False)]


def _line(batches: list[int], ours: list[str], r: PeersResult) -> list[str]:
    by_name = {e.name: _claims(e) for e in r.engines}
    cells = [" / ".join(_fmt(by_name.get(name, {}).get(b)) for b in batches) for name in ours]
    theirs = [e for e in r.engines if e.provider == PeerProvider.TORCHAO and e.speed is not None]
    if not theirs:
        return [f"{r.model} ({r.recipe})", *cells, "refused", "-"]
    best_theirs: list[tuple[float, str] | None] = []
    xs, leads = [], []
    for b in batches:
        found = [(c, e.name.removeprefix(LABEL)) for e in theirs if (c := _claims(e).get(b))]
        best = max(((c.x, name) for c, name in found if c.settled), default=None)
        best_theirs.append(best)
        xs.append(f"{best[0]:.2f}" if best else NOT_SETTLED if found else "-")
        mine = [c for name in ours if (c := by_name.get(name, {}).get(b)) is not None]
        sure = [c.x for c in mine if c.settled]
        lead = f"{max(sure) / best[0] - 1:+.0%}" if best and sure else "-"
        leads.append(NOT_SETTLED if lead == "-" and (found or mine) else lead)
    names = list(dict.fromkeys(best[1] for best in best_theirs if best))
    said = " / ".join(xs) + (f" ({', '.join(names)})" if names else "")
    return [f"{r.model} ({r.recipe})", *cells, said, " / ".join(leads)]


def _ours(e: PeerEngine) -> bool:
    return e.provider == PeerProvider.QUANTSTUDY


def _claims(e: PeerEngine) -> dict[int, XClaim]:
    """The engine's x by batch, each with its claim; none for the fp16 engine."""
    return {b.batch: claim_of(b) for b in e.speed.batches} if e.speed is not None else {}


def _fmt(claim: XClaim | None) -> str:
    return "-" if claim is None else claim.cell(f"{claim.x:.2f}")
