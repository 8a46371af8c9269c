"""`zoo.md`: the leaderboard as a page (ready to go into docs/zoo.md), rendered from zoo.json."""

from __future__ import annotations

from quantstudy.record.vocab import RowStatus
from quantstudy.report.claims import legend
from quantstudy.report.render import ReportCheckError
from quantstudy.zoo.board import Leaderboard, ZooRow, added, launches, summed, tiles_said
from quantstudy.zoo.page_check import check_page
from quantstudy.zoo.render import family_medians, ranked, unsettled

NAMED_FAMILIES = 3  # families named as paying most and least
RANKING = (
    "Rows are ranked by x at the largest batch where it is settled; the rows whose x there is "
    "not settled follow in the list's order, then the rows not timed."
)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _x(row: ZooRow, batch: int) -> str:
    """x and [q1, q3] with its marks (`report/claims.py`): "not settled" where the interval
    contains 1.0, noisy engines, ms medians that disagree; a NaN reads "not measured"."""
    at = row.at(batch)
    return "-" if at is None else at.claim().cell(f"{at.x:.2f} [{at.x_q1:.2f}, {at.x_q3:.2f}]")


def _ms(row: ZooRow, batch: int) -> tuple[str, str]:
    at = row.at(batch)
    return ("-", "-") if at is None else (f"{at.fp16_ms:.3f}", f"{at.fp8_ms:.3f}")


def _ideal(row: ZooRow, batch: int) -> str:
    """The shown x as a fraction of the ideal: none for an x that is not settled, never over
    100% (`XClaim.ideal`)."""
    at = row.at(batch)
    said = None if at is None else at.claim().ideal(at.ideal_x)
    return "-" if said is None else said


def _decision(row: ZooRow) -> str:
    if row.status == RowStatus.NO_LAYER:
        return f"no layer for FP8 (x of {row.x_recipe})"
    if row.status != RowStatus.COMPLETE:  # pending after a refusal: what is to answer it
        return row.status if row.answer is None else f"{row.status}: {row.answer}"
    if not row.quality_measured:
        return "speed only"
    said = (row.decision or "-").replace("_", " ")
    return said if row.agreement is None else f"{said} (top-1 agreement {row.agreement:.2%})"


def _where(board: Leaderboard, row: ZooRow) -> str:
    """The commit that measured the row, and on what; whether it is stale."""
    m = row.measured
    if m is None:
        return "-"
    gpu = (m.environment.get("gpu_name") or "CPU").removeprefix("NVIDIA ")
    said = f"{(m.commit or '-')[:7]}, {gpu}"
    if m.environment.get("lab_switches"):  # engines built otherwise than the commit says
        said += f" (lab switches {m.environment['lab_switches']})"
    return f"{said} (stale: engine sources changed since)" if _stale(board, row) else said


def _stale(board: Leaderboard, row: ZooRow) -> bool:
    """`row` was measured under other engine sources than the board's (`study/sources.py`)."""
    now = board.provenance.engine_sources
    return now is not None and row.measured is not None and row.measured.engine_sources != now


def _counts(board: Leaderboard) -> str:
    """Models per status, and how many of each were measured under other engine sources."""
    said = []
    for status, n in board.counts.items():
        stale = sum(r.status == status and _stale(board, r) for r in board.rows)
        if n:
            said.append(f"{n} {status}" + (f" ({stale} of them stale)" if stale else ""))
    return ", ".join(said)


def _timing(row: ZooRow) -> str:
    """Process, study and build seconds; of the study, tile tuning and GPU-lock waits."""
    said = " / ".join(_num(v, ".0f") for v in (row.wall_s, row.study_s, row.build_s))
    if row.tune_s is None or row.lock_wait_s is None:
        return said
    return f"{said} (tuning {row.tune_s:.0f}, lock {row.lock_wait_s:.0f})"


def _layers(row: ZooRow) -> str:
    if row.fp8_layers is None or row.conv_linear_layers is None:
        return "-"
    return f"{row.fp8_layers} / {row.conv_linear_layers}"


def _provenance(board: Leaderboard) -> list[str]:
    p = board.provenance
    lines = [f"Command: `{' '.join(p.command)}` (shard {p.shard}, weights {p.weights})."]
    for env in p.environments:
        keys = ("gpu_name", "gpu_driver", "cuda", "torch", "triton", "timm", "git_commit")
        lines.append("Studies ran on: " + ", ".join(f"{k} {env.get(k) or '-'}" for k in keys) + ".")
    if p.throughput is not None:
        lines.append(f"This run: {p.throughput.line()}.")
    runs = p.runs
    if len(runs) > 1 and (total := summed(runs)) is not None:
        said = f"The {len(runs)} runs into this folder under these engine sources"
        lines.append(f"{said}: {total.line()}.")
    lines += _tiles(board)
    driver = p.driver
    if not driver:  # rendered from committed rows (`zoo/run.py: write_board`)
        lines.append(
            f"Rendered from the committed rows (last measured {p.created_utc}) over "
            f"{p.models_file} (sha256 {p.models_sha256[:12]}); each row names its commit."
        )
        return lines
    lines.append(
        f"Leaderboard written {p.created_utc} from {p.models_file} (sha256 "
        f"{p.models_sha256[:12]}) at commit {driver.get('git_commit') or '-'}, triton "
        f"{driver.get('triton') or '-'}."
    )
    return lines


def _tiles(board: Leaderboard) -> list[str]:
    """Where the launches of the page's rows took their tiles, over the rows that say it
    (committed rows kept from earlier runs included, unlike the runs' lines)."""
    said = [r for r in board.rows if r.tile_choices is not None]
    total = added([r.tile_choices for r in said])
    if total is None or not launches(total):
        return []
    rows = f"{len(said)} rows that say it" if len(said) > 1 else "1 row that says it"
    return [f"The rows' studies ({rows}): {tiles_said(total)}."]


def _families(board: Leaderboard, batch: int) -> list[str]:
    medians = family_medians(board.rows, batch)
    if len(medians) < 2:
        left = _left_out(board, batch)
        return [*left, ""] if left else []

    def said(items: list[tuple[str, float, int]]) -> str:
        return ", ".join(f"{f} ({x:.2f}, {n} model{'s' * (n > 1)})" for f, x, n in items)

    k = min(NAMED_FAMILIES, len(medians) // 2)
    lines = [
        f"Median x at batch {batch} per family, from the rows below whose x is settled: most "
        f"{said(medians[:k])}; least {said(medians[-k:][::-1])}."
    ]
    return [*lines, *_left_out(board, batch), ""]


def _left_out(board: Leaderboard, batch: int) -> list[str]:
    """The timed rows that no ranking or family median counts, by name."""
    out = unsettled(board.rows, batch)
    if not out:
        return []
    names = ", ".join(r.model for r in out)
    return [
        f"Not settled at batch {batch} ([q1, q3] of x contains 1.0, so the rounds do not "
        f"support the sign of the gain), not ranked and left out of the family medians: {names}."
    ]


def render_markdown(board: Leaderboard) -> str:
    """The page, checked against its board (`zoo/page_check.py`): a page that shows a gain its
    rows' rounds do not support is a renderer bug, raised, never written."""
    md = render_unchecked(board)
    problems = check_page(md, board)
    if problems:
        raise ReportCheckError("zoo page failed its self-check:\n  " + "\n  ".join(problems))
    return md


def render_unchecked(board: Leaderboard) -> str:
    """The page as rendered, before its self-check (what `render_markdown` checks)."""
    batches = board.batches
    last = max(batches)
    lines = ["# FP8 against fp16 per timm model", "", *_provenance(board), ""]
    lines += [f"{len(board.rows)} models ({_counts(board)}).", ""]
    sources = (board.provenance.engine_sources or "-")[:12]
    lines += [f"Engine sources of this page (`study/sources.py`): {sources}.", ""]
    if any(_stale(board, r) for r in board.rows):
        lines += [
            "Rows marked *stale* were measured under other engine sources than this page's: "
            "their figures are of older engine code, and the next GPU run measures them again.",
            "",
        ]
    if any(r.status == "complete" and not r.quality_measured for r in board.rows):
        lines += [
            "Rows marked *speed only* ran with random weights (or without a quality pass): the "
            "kernels' time does not depend on the weights' values, so their timings hold; no "
            "quality and no decision is claimed for them.",
            "",
        ]
    if any(r.speed_meaningful is False for r in board.rows):
        lines += ["Timings ran on the CPU: x is not evidence for or against FP8 on a GPU.", ""]
    lines += _families(board, last)
    head = ["model", "family", "params (M)", "GMACs", "img", "FP8 / conv+linear", "recipe"]
    for b in batches:
        head += [f"fp16 ms @{b}", f"FP8 ms @{b}", f"x @{b} [q1, q3]"]
    head += [f"of ideal x @{last}", "decision", "s: process / study / build", "measured at"]
    if any(r.tune_s is not None for r in board.rows):
        head[-2] = "s: process / study / build (tuning, lock wait)"
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in ranked(board.rows, last):
        cells = [r.model, r.family, _num(r.params_m, ".1f"), _num(r.gmacs, ".2f")]
        cells += [str(r.img_size or "-"), _layers(r), r.recipe or "-"]
        for b in batches:
            cells += [*_ms(r, b), _x(r, b)]
        cells += [_ideal(r, last), _decision(r), _timing(r), _where(board, r)]
        lines.append("| " + " | ".join(cells) + " |")
    claims = [at.claim() for r in board.rows for b in batches if (at := r.at(b)) is not None]
    if claims:
        lines += ["", *legend(claims), "", RANKING]
    answers = [r for r in board.rows if r.status == RowStatus.NO_LAYER]
    if answers:
        lines += ["", "## Models with no layer where FP8 pays", ""]
        lines += [f"- {r.model}: {r.answer}" for r in answers]
    failed = [r for r in board.rows if r.status == RowStatus.FAILED]
    if failed:
        lines += ["", "## Models that failed", ""]
        lines += [f"- {r.model}: {r.error} (log: `{r.folder}/run.log`)" for r in failed]
    if board.plot:
        lines += ["", f"![x at batch {last} against GMACs, by family]({board.plot})"]
    return "\n".join(lines) + "\n"
