"""The peers record as Markdown: one table, a line per engine of each model, then the notes.

Every figure is a field of the record, formatted by the report's formatters: x per batch with
the quartiles of its per-round ratios, the ideal x of the recipe's layers at that batch and the
fraction of it reached, agreement with fp32 and the KL mean. The fp16 line gives the fp16
engine's median ms per call where the others give x. A figure that was not computed is a dash
with a note saying why; a refused engine is a line saying so, its reason in the notes, and each
row that records it names the commit that measured it (a record's rows may come from several).
"""

from __future__ import annotations

from quantstudy.bench.peers.summary import summary_table
from quantstudy.bench.schema import PeerEngine, PeersBench, PeersResult, RowPhase
from quantstudy.record import BatchSpeed, TimingStats
from quantstudy.record.vocab import PeerProvider
from quantstudy.report.claims import NOT_SETTLED, claim_of, legend
from quantstudy.report.format import code, fmt_ms, fmt_ratio, fmt_sig, table


def header(batches: list[int]) -> list[str]:
    return [
        "model",
        "engine",
        "FP8 layers",
        *(f"x at {b} [q1-q3]" for b in batches),
        *(f"ideal x at {b} (reached)" for b in batches),
        "agreement with fp32",
        "KL mean",
    ]


def peers_table(rec: PeersBench) -> list[str]:
    """The table of every row, then its notes."""
    rows: list[list[str]] = []
    notes: list[str] = []
    for result in rec.results:
        body, more = _model_rows(rec.batches, result)
        rows += body
        notes += more
    return [*table(header(rec.batches), rows), *(["", *notes] if notes else [])]


def row_lines(rec: PeersBench, result: PeersResult) -> list[str]:
    """One model's table and notes (what a run prints after each row)."""
    body, notes = _model_rows(rec.batches, result)
    return ["", *table(header(rec.batches), body), *notes]


def peers_section(name: str, rec: PeersBench, provenance: list[str]) -> list[str]:
    """The record's section of `quantstudy bench report` (`provenance`: its lines)."""
    counts = ", ".join(f"{r.model}: {r.n_images} held-out images" for r in rec.results)
    lines = [
        f"### {name}",
        "",
        *provenance,
        f"Every engine of a model on the layers its recipe selects, timed in the same "
        f"interleaved rounds ({rec.rounds} rounds of {rec.iters} calls, compile mode "
        f"{code(rec.compile_mode)}) and scored against fp32 at batch {rec.quality_batch} "
        f"({counts}). In short, then each engine:",
        "",
    ]
    parts = [line for r in rec.results if r.phases for line in ["", *phase_table(r)]]
    claims = [claim_of(b) for r in rec.results for e in r.engines if e.speed
              for b in e.speed.batches]  # fmt: skip
    peers = [*peers_table(rec), "", *legend(claims, ms_shown=False)]
    return [*lines, *summary_table(rec), "", *peers, *parts, ""]


def _model_rows(batches: list[int], r: PeersResult) -> tuple[list[list[str]], list[str]]:
    rows, notes = [], []
    fp16 = _fp16_speeds(r)
    for e in r.engines:
        layers = "-" if e.provider == PeerProvider.FP16 else f"{e.fp8_layers}/{r.selected}"
        rows.append(
            [r.model, e.name, layers, *_x_cells(batches, e, fp16), *_ideal_cells(batches, e),
             _agreement(e), fmt_sig(e.quality.kl_mean)]
        )  # fmt: skip
        if e.ideal_missing and e.speed is not None:
            notes.append(f"- {r.model}, {e.name}: no {e.ideal_missing}")
        if e.half_layers and e.provider != PeerProvider.FP16:
            reasons = sorted(set(e.half_layers.values()))
            notes.append(
                f"- {r.model}, {e.name}: {len(e.half_layers)} of the recipe's {r.selected} "
                f"layers not run as FP8 products: {'; '.join(reasons)}"
            )
    blank = ["-"] * (2 * len(batches) + 2)
    for refused in r.refused:
        rows.append([r.model, refused.name, "refused", *blank])
        notes.append(f"- {r.model}, {refused.name}: refused: {refused.reason}")
    if r.git_commit is not None:  # rows of several commits sit side by side (`alike.py`)
        sources = f", engine sources {r.engine_sources[:12]}" if r.engine_sources else ""
        notes.append(f"- {r.model}: measured at commit {r.git_commit[:7]}{sources}")
    return rows, notes


def _fp16_speeds(r: PeersResult) -> dict[int, BatchSpeed]:
    """fp16's timings by batch: the same rounds are in every FP8 engine's section."""
    for e in r.engines:
        if e.speed is not None:
            return {b.batch: b for b in e.speed.batches}
    return {}


def _x_cells(batches: list[int], e: PeerEngine, fp16: dict[int, BatchSpeed]) -> list[str]:
    if e.speed is None:  # the fp16 engine: its own time, against which the others are x
        return [f"{fmt_ms(fp16[b].fp16_ms.median)} ms" if b in fp16 else "-" for b in batches]
    found = {b.batch: b for b in e.speed.batches}
    return [claim_of(t).cell(_x(t.ratio)) if (t := found.get(b)) else "-" for b in batches]


def _x(t: TimingStats) -> str:
    return f"{fmt_ratio(t.median)} [{fmt_ratio(t.q1)}-{fmt_ratio(t.q3)}]"


def _ideal_cells(batches: list[int], e: PeerEngine) -> list[str]:
    """The ideal x and the fraction of it reached: withheld for an x that is not settled, and
    never over 100% (`report/claims.py`)."""
    if e.speed is None:
        return ["-"] * len(batches)
    ideal = {i.batch: i for i in e.speed.ideal or []}
    claims = {b.batch: claim_of(b) for b in e.speed.batches}
    cells = []
    for b in batches:
        i, claim = ideal.get(b), claims.get(b)
        if i is None:
            cells.append("-")
        elif claim is not None and not claim.settled:
            cells.append(f"{fmt_ratio(i.ideal_x)} (x {NOT_SETTLED})")
        elif i.fraction >= 1:
            cells.append(f"{fmt_ratio(i.ideal_x)} (reached or passed)")
        else:
            cells.append(f"{fmt_ratio(i.ideal_x)} ({100 * i.fraction:.0f}%)")
    return cells


def _agreement(e: PeerEngine) -> str:
    q = e.quality
    return f"{q.agreement:.4f} ({q.n_images - q.differ_count}/{q.n_images})"


ROW = "(row)"  # the parts table's line for the parts of the row, not of one engine


def at_batch(batch: int | None) -> str | None:
    return None if batch is None else f"at {batch}"


def _column(phase: RowPhase) -> str:
    return phase.step.value if phase.batch is None else f"{phase.step} {at_batch(phase.batch)}"


def phase_table(result: PeersResult) -> list[str]:
    """Seconds per engine (a line each, the row's own parts on the first) and part (a column
    each, per batch where a part runs per batch), the autotuner's share in parentheses; then the
    total and what no part holds. Empty for a row that did not record its parts."""
    if not result.phases:
        return []
    columns = list(dict.fromkeys(_column(p) for p in result.phases))
    lines = list(dict.fromkeys(p.engine or ROW for p in result.phases))
    cells: dict[tuple[str, str], list[float]] = {}
    for p in result.phases:
        cell = cells.setdefault((p.engine or ROW, _column(p)), [0.0, 0.0])
        cell[0] += p.seconds
        cell[1] += p.autotune_s
    rows = []
    for line in lines:
        found = [cells.get((line, c)) for c in columns]
        total = sum(c[0] for c in found if c is not None)
        rows.append([line, *(_seconds(c) for c in found), f"{total:.1f}"])
    parts = sum(p.seconds for p in result.phases)
    return [
        f"where the {result.seconds:.1f} s of {result.model}'s row went (seconds; in parentheses "
        f"the autotuner's; {result.seconds - parts:.1f} s between parts):",
        *table(["engine", *columns, "sum"], rows),
    ]


def _seconds(cell: list[float] | None) -> str:
    if cell is None:
        return "-"
    seconds, tuned = cell
    return f"{seconds:.1f} ({tuned:.1f})" if tuned >= 0.05 else f"{seconds:.1f}"
