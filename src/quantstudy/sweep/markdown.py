"""`sweep.md` and the Pareto plots, rendered from `SweepSummary` (sweep.json) alone."""

from __future__ import annotations

import re
from pathlib import Path

from quantstudy.report.claims import legend
from quantstudy.sweep.summary import SweepRow, SweepSummary


def _x(row: SweepRow, batch: int) -> str:
    """x (q1-q3) with its marks (`report/claims.py`)."""
    b = next((b for b in row.x if b.batch == batch), None)
    return "-" if b is None else b.claim().cell(f"{b.median:.3f} ({b.q1:.3f}-{b.q3:.3f})")


def _agreement(row: SweepRow) -> str:
    if row.agreement is None:
        return "-"
    return f"{row.agreement:.2%} ({row.differ_count} of {row.n_images} differ)"


def _top1(row: SweepRow) -> str:
    if row.top1_change is None:
        return "-" if row.quality_meaningful is not False else "n/a (random weights)"
    ci = (
        f" [{row.ci_low * 100:+.2f}, {row.ci_high * 100:+.2f}]"
        if row.ci_low is not None and row.ci_high is not None
        else ""
    )
    note = "" if row.quality_meaningful is not False else " (random weights)"
    return f"{row.top1_change * 100:+.2f} pts{ci}{note}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plot_name(model: str) -> str:
    return "pareto-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model) + ".png"


def render_markdown(s: SweepSummary) -> str:
    batches = sorted({b.batch for r in s.rows for b in r.x})
    counts = ", ".join(f"{n} {status}" for status, n in s.counts.items() if n)
    lines = [
        f"# Sweep {s.sweep_file}",
        "",
        f"{len(s.rows)} studies on {s.device} ({counts}); executor {s.executor}. Every figure "
        "below is copied from the study's own `study.json` (folder column).",
        "",
    ]
    if any(r.speed_meaningful is False for r in s.rows):
        lines += ["Timings ran on the CPU: x is not evidence for or against FP8 on a GPU.", ""]
    if not batches:
        lines += ["Speed was not measured in this sweep (speed: false): no x, no Pareto plot.", ""]
    if any(r.quality_meaningful is False for r in s.rows):
        lines += [
            "Studies with random weights: agreement and KL are measured, accuracy is not.",
            "",
        ]
    lines += ["## Best recipe per model", "", "| model | best study | recipe | calibrator | why |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for b in s.best:
        lines.append(
            f"| {b.model} | {b.folder or 'none'} | {b.recipe or '-'} | {b.calibrator or '-'} "
            f"| {b.why} |"
        )
    head = ["model", "recipe", "calibrator", "seed", "kernel", "status"]
    head += [f"x @ {b} (q1-q3)" for b in batches]
    head += ["agreement", "KL mean", "top-1 change [CI]", "decision", "study s", "folder"]
    lines += ["", "## Studies", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + " --- |" * len(head))
    for r in s.rows:
        cells = [r.model, r.recipe, r.calibrator or "-", str(r.seed), r.fp8_kernel, r.status]
        cells += [_x(r, b) for b in batches]
        decision = (r.decision or "-").replace("_", " ")
        cells += [_agreement(r), _num(r.kl_mean, ".4g"), _top1(r), decision]
        cells += [_num(r.study_s, ".1f"), r.folder]
        lines.append("| " + " | ".join(cells) + " |")
    if batches:
        lines += ["", *legend([b.claim() for r in s.rows for b in r.x])]
    failed = [r for r in s.rows if r.status == "failed"]
    if failed:
        lines += ["", "## Failed points", ""]
        lines += [f"- {r.folder}: {r.error} (log: `{r.folder}/run.log`)" for r in failed]
    if s.plots:
        lines += ["", "## Pareto plots (x at the largest batch against agreement)", ""]
        lines += [f"![{model}]({name})" for model, name in s.plots.items()]
    return "\n".join(lines) + "\n"


def write_plots(s: SweepSummary, out: Path) -> dict[str, str]:
    """One Pareto plot per model with x measured: x at the largest batch vs agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = {}
    for model in dict.fromkeys(r.model for r in s.rows):
        rows = [r for r in s.rows if r.model == model and r.x_last and r.agreement is not None]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        front = _pareto(rows)
        for r in rows:
            x = r.x_last
            assert x is not None  # filtered above
            on_front = r in front
            ax.errorbar(
                x.median,
                r.agreement,
                xerr=[[x.median - x.q1], [x.q3 - x.median]],
                fmt="o" if on_front else "x",
                color="tab:blue" if on_front else "tab:gray",
            )
            ax.annotate(
                f"{r.recipe}",
                (x.median, r.agreement),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        batch = rows[0].x_last.batch  # type: ignore[union-attr]
        cpu = "\nCPU timings: not evidence for a GPU" if rows[0].speed_meaningful is False else ""
        ax.set_xlabel(f"x = fp16 ms / FP8 ms at batch {batch} (median, q1-q3)")
        ax.set_ylabel("top-1 agreement with fp32")
        ax.set_title(f"{model}: {len(rows)} studies, Pareto front as dots{cpu}", fontsize=10)
        ax.axvline(1.0, color="lightgray", lw=0.8)
        fig.tight_layout()
        name = plot_name(model)
        fig.savefig(out / name, dpi=100, metadata={"Software": None})
        plt.close(fig)
        plots[model] = name
    return plots


def _pareto(rows: list[SweepRow]) -> list[SweepRow]:
    """Rows no other row beats on both x (at the largest batch) and agreement."""

    def key(r: SweepRow) -> tuple[float, float]:
        return (r.x_last.median, r.agreement)  # type: ignore[union-attr,return-value]

    return [
        r
        for r in rows
        if not any(
            key(o)[0] >= key(r)[0] and key(o)[1] >= key(r)[1] and key(o) != key(r) for o in rows
        )
    ]
