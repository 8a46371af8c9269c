"""`sweep.json`: one row per grid point, read from each study's record and point.json.

Every figure is copied from a study.json; nothing is computed here except the choice of the
best recipe per model, which is the policy's: among the studies whose decision is ship, the one
with the largest median x at the largest timed batch.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import Field

from quantstudy.record import BatchSpeed, StudyRecord
from quantstudy.record.base import Section
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL
from quantstudy.record.vocab import Engine, Outcome
from quantstudy.report.claims import XClaim, claim_of
from quantstudy.sweep.events import Job
from quantstudy.sweep.study_row import StudyRow, fp8_quality, read_row


class BatchX(Section):
    """x = fp16 ms / FP8 ms at one batch: median and quartiles over the timing rounds, and what
    a table needs to mark it (`report/claims.py`); None: a sweep.json written before they were
    kept, whose x is still marked from its own interval."""

    batch: int
    median: float
    q1: float
    q3: float
    fp16_ms: float | None = None  # each engine's median over the same rounds
    fp8_ms: float | None = None
    fp16_spread: float | None = None  # each engine's IQR / median
    fp8_spread: float | None = None
    rounds: int | None = None
    warnings: list[str] | None = None  # the study's own (`speed/stats.py: speed_warnings`)

    def claim(self) -> XClaim:
        return XClaim(
            x=self.median, q1=self.q1, q3=self.q3, fp16_ms=self.fp16_ms, fp8_ms=self.fp8_ms,
            fp16_spread=self.fp16_spread, fp8_spread=self.fp8_spread, rounds=self.rounds,
        )  # fmt: skip


class SweepRow(StudyRow):
    weights: str
    recipe: str  # the recipe the study ran (a sweep-derived one is named <recipe>-<calibrator>)
    calibrator: str | None  # the one the study used; None when it did not get that far
    seed: int
    fp8_kernel: str  # an FP8 backend's name or "fastest"
    x: list[BatchX] = Field(default_factory=list)
    n_images: int | None = None
    differ_count: int | None = None
    top1_change: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    quality_meaningful: bool | None = None  # False: random weights
    failed_gates: list[str] = Field(default_factory=list)

    @property
    def x_last(self) -> BatchX | None:
        """x at the largest timed batch."""
        return max(self.x, key=lambda b: b.batch) if self.x else None


class ModelBest(Section):
    model: str
    folder: str | None  # None: no study of this model ships
    recipe: str | None = None
    calibrator: str | None = None
    why: str


class SweepSummary(Section):
    sweep_file: str
    executor: str
    device: str
    counts: dict[str, int]  # status -> points
    rows: list[SweepRow]
    best: list[ModelBest]
    plots: dict[str, str]  # model -> Pareto plot file, relative to --out


def collect_row(job: Job, out: Path) -> SweepRow:
    """The row of one grid point from its folder (whatever stage it reached)."""
    p, c = job.point, job.point.config
    base = {
        "model": c.model,
        "weights": c.weights,
        "recipe": Path(p.recipe).stem if "/" in p.recipe else p.recipe,
        "calibrator": p.calibrator,
        "seed": c.seed,
        "fp8_kernel": c.fp8_kernel or DEFAULT_FP8_KERNEL,
    }
    return read_row(out / job.folder, SweepRow, base, _measured)


def _measured(record: StudyRecord) -> dict[str, Any]:
    """The sweep's own figures from a study record, beyond `sweep/study_row.py`'s."""
    found: dict[str, Any] = fp8_quality(record)
    if record.recipe is not None:
        found["calibrator"] = record.recipe.calibrator
    if record.speed is not None:
        found["x"] = [_batch_x(b) for b in record.speed.batches]
    if record.quality is not None:
        fp8 = next((e for e in record.quality.engines if e.engine == Engine.FP8), None)
        found["quality_meaningful"] = record.quality.meaningful
        if fp8 is not None:
            found |= {
                "n_images": fp8.n_images,
                "differ_count": fp8.differ_count,
                "top1_change": fp8.top1_change,
                "ci_low": fp8.ci_low,
                "ci_high": fp8.ci_high,
            }
    if record.decision is not None:
        found["failed_gates"] = list(record.decision.failed)
    return found


def _batch_x(b: BatchSpeed) -> BatchX:
    """One batch's x as the sweep keeps it: its claim's figures (`report/claims.py: claim_of`,
    x kept as `median`) and the study's warnings."""
    claim = asdict(claim_of(b))
    return BatchX(batch=b.batch, median=claim.pop("x"), warnings=list(b.warnings), **claim)


def _none_why(complete: int, shipping: int) -> str:
    """Why no study of a model is best."""
    if shipping:
        return f"none of {shipping} shipping studies has a settled x at its largest batch"
    if complete:
        return f"none of {complete} complete studies ships under the policy"
    return "no study of this model completed"


def best_per_model(rows: list[SweepRow]) -> list[ModelBest]:
    """Per model, the shipping study with the largest x at the largest batch, among those whose
    x there is settled (`report/claims.py`: an x whose rounds do not support its sign is not
    ranked)."""
    best = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model and r.status == "complete"]
        shipping = [r for r in mine if r.decision == Outcome.SHIP and r.x_last is not None]
        ships = [r for r in shipping if r.x_last is not None and r.x_last.claim().settled]
        if not ships:
            why = _none_why(len(mine), len(shipping))
            best.append(ModelBest(model=model, folder=None, why=why))
            continue
        top = max(ships, key=lambda r: (r.x_last.median, r.agreement or 0.0))  # type: ignore[union-attr]
        x = top.x_last
        assert x is not None  # filtered above
        why = (
            f"ships; largest median x at batch {x.batch} ({x.median:.3f}) of {len(ships)} shipping"
        )
        if len(ships) < len(shipping):
            why += f" with a settled x ({len(shipping) - len(ships)} more, x not settled)"
        best.append(
            ModelBest(
                model=model,
                folder=top.folder,
                recipe=top.recipe,
                calibrator=top.calibrator,
                why=why,
            )
        )
    return best
