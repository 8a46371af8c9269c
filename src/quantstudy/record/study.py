"""`StudyRecord`: every section of one study, composed, and the digest that seals it.

The digest is the SHA-256 of the record's JSON (sorted keys, no whitespace) without the keys in
`UNSEALED`: `record/io.py: write_record` stores it with every write, and `quantstudy report`
recomputes it, so a number edited or a section deleted after the study is caught. The decision is
left out because `quantstudy decide` takes it again later from the sealed measurements; the
report's self-check then checks that it follows from them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from quantstudy.record.base import SCHEMA_VERSION, Section
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.decision import Decision
from quantstudy.record.engines import EngineInfo
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import (
    DataInfo,
    Environment,
    ModelInfo,
    Preprocessing,
    StudyConfig,
)
from quantstudy.record.quality import EngineQuality, QualitySection
from quantstudy.record.recipe import CalibrationInfo, RecipeInfo
from quantstudy.record.search import (
    LayerSpeedSection,
    Measured,
    SearchPrediction,
    SearchSection,
    SensitivitySection,
)
from quantstudy.record.sequential import SequentialSection
from quantstudy.record.side import SideFile
from quantstudy.record.speed import BatchSpeed, SpeedSection
from quantstudy.record.timings import TimingsSection
from quantstudy.record.vocab import Engine


class Variant(Section):
    """A recipe variant studied next to the main recipe (e.g. weight-only, no layer1)."""

    name: str
    recipe: str
    selected_count: int
    quality: EngineQuality | None = None
    speed: list[BatchSpeed] | None = None
    predicted: SearchPrediction | None = None  # the additive model's prediction for this recipe
    measured: Measured | None = None  # what this recipe's own study measured


class StudyRecord(Section):
    schema_version: int = SCHEMA_VERSION
    name: str
    status: Literal["complete", "partial"]
    config: StudyConfig
    environment: Environment
    model: ModelInfo
    preprocessing: Preprocessing
    data: DataInfo
    recipe: RecipeInfo | None = None
    calibration: CalibrationInfo | None = None
    engines: list[EngineInfo] = Field(default_factory=list)
    quality: QualitySection | None = None
    speed: SpeedSection | None = None
    decision: Decision | None = None
    variants: list[Variant] = Field(default_factory=list)
    sensitivity: SensitivitySection | None = None
    layer_speed: LayerSpeedSection | None = None
    search: SearchSection | None = None
    timings: TimingsSection | None = None  # wall time per stage of the run that wrote it
    sequential: SequentialSection | None = None  # looks of a `--heldout auto` study
    per_image: SideFile | None = None  # the held-out pass's per-image rows, beside study.json
    not_run: list[str] = Field(
        default_factory=list
    )  # plain statements of what this study did not measure
    digest: str | None = None  # `record_digest` of this record as written; None: not sealed

    def engine(self, name: str) -> EngineInfo | None:
        """The engine `name` ("fp8", ...) as built, or None where the study built none."""
        return next((e for e in self.engines if e.name == name), None)

    def build_spec(self, replay_choice: bool = True) -> BuildSpec:
        """The build spec of the study's FP8 engine as it ran: its config, summing as it
        summed, under the lab switches it ran under; with `replay_choice` its per-layer kernel
        choice replayed (the one place a rebuild from the record takes it: `load_engine`,
        `extend`, `package`)."""
        fp8 = self.engine(Engine.FP8)
        replay = fp8.layout.replay() if fp8 is not None and replay_choice else None
        switches = self.environment.lab_switches or {}
        return self.config.build_spec(replay, switches, recorded=True)


UNSEALED = frozenset({"digest", "decision"})


def record_digest(data: dict[str, Any]) -> str:
    """SHA-256 of a record's JSON form (`model_dump(mode="json")`) without `UNSEALED` keys."""
    sealed = {k: v for k, v in data.items() if k not in UNSEALED}
    blob = json.dumps(sealed, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# The schema version that began sealing records: a record of this version or later without a
# digest had it deleted (or was built by hand), so nothing vouches for its numbers.
SEALED_SINCE = 6


def unsealed(record: StudyRecord) -> bool:
    """A record of a sealing schema without its digest: its numbers cannot be checked."""
    return record.digest is None and record.schema_version >= SEALED_SINCE


MODIFIED = "this record was modified after the study"


def check_seal(path: Path, data: dict[str, Any], command: str | None = None) -> None:
    """A sealed record must match the digest written with it, whoever reads it.

    A record without a digest is not sealed and cannot be checked: from before schema 6 (it
    loads as it is), or of a later schema with its digest deleted or built by hand. `report`
    renders the latter with an "unsealed" banner; a `command` that acts on the numbers
    (`decide` decides them, `export` ships them) refuses it. The digest catches edits, not
    forgery: anyone can compute a SHA-256 again."""
    stored = data.get("digest")
    if stored is not None and record_digest(data) != stored:
        raise UserError(
            f"{path}: {MODIFIED} (its measured sections no longer match the digest written "
            "with them); rerun the study (the same command resumes from its cache) to get a "
            "record that can be trusted"
        )
    version = data.get("schema_version")
    if command and stored is None and isinstance(version, int) and version >= SEALED_SINCE:
        raise UserError(
            f"{path} carries no digest, so its numbers cannot be checked against the study "
            f"that measured them; {command} refuses it: rerun the study (the same command "
            "resumes from its cache) for a sealed record"
        )
