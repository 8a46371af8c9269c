"""The leaderboard (`zoo.json`): one row per model of the list, copied from its study's record.

Every figure comes from a study.json (the folder column names it) or from the model's point.json
when its study failed; nothing is measured here. Quality and the decision are carried only from
studies that measured quality on real weights; a speed-only row says so instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from quantstudy.record import StudyRecord
from quantstudy.record.vocab import Engine
from quantstudy.sweep.events import Job
from quantstudy.sweep.point import read_status
from quantstudy.zoo.catalogue import ZooEntry

LEADERBOARD_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ZooBatch(Strict):
    """fp16 against FP8 at one batch size: medians over the timing rounds, the quartiles of x,
    and the tool's roofline for the FP8 engine (`speed/ideal.py`)."""

    batch: int
    fp16_ms: float
    fp8_ms: float
    x: float  # median of x = fp16 ms / FP8 ms over round pairs
    x_q1: float
    x_q3: float
    ideal_x: float | None = None  # None: not computed (CPU, an unknown GPU, nothing priced)
    ideal_fraction: float | None = None  # x / ideal_x


class ZooRow(Strict):
    model: str
    family: str
    folder: str  # the study's folder inside --out
    status: str  # complete | failed | interrupted | partial | pending
    error: str | None = None
    weights: str | None = None  # random | cache | named | file (the record's ModelInfo.weights)
    params_m: float | None = None  # parameters, millions
    gmacs: float | None = None  # conv and linear multiply-accumulates per image, billions
    img_size: int | None = None
    fp8_layers: int | None = None  # layers the FP8 engine ran as real FP8 products
    conv_linear_layers: int | None = None  # conv and linear layers the recipe looked at
    recipe: str | None = None
    speed_meaningful: bool | None = None  # False: CPU timings
    batches: list[ZooBatch] = []
    quality_measured: bool = False  # real weights and a quality pass
    agreement: float | None = None  # FP8 top-1 agreement with fp32 (quality rows only)
    kl_mean: float | None = None
    decision: str | None = None  # ship | not_ship | inconclusive (quality rows only)
    wall_s: float | None = None  # the study's process, start to end (imports included)
    study_s: float | None = None  # the study's run, start to end
    build_s: float | None = None  # engine builds, compilation and kernel tuning
    stages: dict[str, float] = {}  # every stage of the run, seconds

    def at(self, batch: int) -> ZooBatch | None:
        return next((b for b in self.batches if b.batch == batch), None)


class Provenance(Strict):
    command: list[str]
    created_utc: str
    models_file: str
    models_sha256: str
    shard: str  # the shard this command ran ("1/1": all)
    weights: str  # the zoo's --weights mode
    device: str
    driver: dict[str, str | None]  # the zoo command's own environment (commit, versions)
    environments: list[dict[str, str | None]]  # each distinct environment the studies recorded


class Leaderboard(Strict):
    version: int = LEADERBOARD_VERSION
    provenance: Provenance
    batches: list[int]
    counts: dict[str, int]  # status -> models
    rows: list[ZooRow]
    plot: str | None = None  # the plot's file beside zoo.json; None: nothing to plot


ENVIRONMENT_KEYS = (
    "gpu_name",
    "gpu_driver",
    "cuda",
    "torch",
    "timm",
    "python",
    "quantstudy",
    "git_commit",
)


def recorded_environment(folder: Path) -> dict[str, str | None] | None:
    """The environment a study recorded (`ENVIRONMENT_KEYS`), None without a readable record."""
    try:
        env = json.loads((folder / "study.json").read_text(encoding="utf-8"))["environment"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {k: None if env.get(k) is None else str(env[k]) for k in ENVIRONMENT_KEYS}


def collect_row(entry: ZooEntry, job: Job, out: Path) -> ZooRow:
    """The row of one model from its folder, whatever stage its study reached."""
    folder = out / job.folder
    status = read_status(folder)
    base = ZooRow(
        model=entry.name,
        family=entry.family,
        folder=job.folder,
        status=status.status if status else "pending",
        error=status.error if status else None,
        wall_s=status.wall_s if status else None,
    )
    study = folder / "study.json"
    if not study.is_file():
        return base
    try:
        record = StudyRecord.model_validate_json(study.read_text(encoding="utf-8"))
    except ValidationError as err:  # e.g. written by another version: the row says so
        problem = f"study.json does not load: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}"
        return base.model_copy(update={"status": "failed", "error": problem})
    found = _measured(record)
    if record.status != "complete" and base.status == "complete":
        found["status"] = "partial"
    return ZooRow.model_validate(base.model_dump() | found)


def _measured(record: StudyRecord) -> dict[str, object]:
    """The row's figures from a study record."""
    found: dict[str, object] = {
        "weights": record.model.weights,
        "params_m": record.model.num_params / 1e6,
        "gmacs": record.model.macs / 1e9 if record.model.macs is not None else None,
        "img_size": record.preprocessing.input_size[1],
    }
    if record.recipe is not None:
        found["recipe"] = record.recipe.name
        found["conv_linear_layers"] = len(record.recipe.selected) + len(record.recipe.excluded)
    fp8 = record.engine(Engine.FP8)
    if fp8 is not None:
        found["fp8_layers"] = len(fp8.fp8_real)
    if record.speed is not None:
        found["speed_meaningful"] = record.speed.meaningful
        ideal = {i.batch: i for i in record.speed.ideal or []}
        found["batches"] = [
            ZooBatch(
                batch=b.batch,
                fp16_ms=b.fp16_ms.median,
                fp8_ms=b.fp8_ms.median,
                x=b.ratio.median,
                x_q1=b.ratio.q1,
                x_q3=b.ratio.q3,
                ideal_x=ideal[b.batch].ideal_x if b.batch in ideal else None,
                ideal_fraction=ideal[b.batch].fraction if b.batch in ideal else None,
            )
            for b in record.speed.batches
        ]
    found |= _quality(record)
    if record.timings is not None:
        stages = {s.stage: s.seconds for s in record.timings.stages}
        found["stages"] = stages
        found["study_s"] = record.timings.total_s
        found["build_s"] = round(sum(v for k, v in stages.items() if _is_build(k)), 3)
    return found


def _is_build(stage: str) -> bool:
    """An engine's build, or its compilation and tuning at a batch (`study/speed_only.py`)."""
    return stage.startswith("engine ") and (": build" in stage or ": compile" in stage)


def _quality(record: StudyRecord) -> dict[str, object]:
    """Quality and the decision, only where real weights were scored."""
    q = record.quality
    if q is None or not q.meaningful or record.model.random_weights:
        return {}
    fp8 = next((e for e in q.engines if e.engine == Engine.FP8), None)
    found: dict[str, object] = {"quality_measured": True}
    if fp8 is not None:
        found |= {"agreement": fp8.agreement, "kl_mean": fp8.kl_mean}
    if record.decision is not None:
        found["decision"] = str(record.decision.outcome)
    return found
