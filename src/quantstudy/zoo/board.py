"""The leaderboard (`zoo.json`): one row per model of the list, copied from its study's record.

Every figure comes from a study.json (the folder column names it) or from the model's point.json
when its study failed; nothing is measured here. Quality and the decision are carried only from
studies that measured quality on real weights; a speed-only row says so instead.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import Field

from quantstudy.env.switches import switches_said
from quantstudy.record import BatchSpeed, IdealSpeed, StudyRecord
from quantstudy.record.base import Section
from quantstudy.record.timings import CHOSEN_SINCE, HELD_SINCE, SPENT_SINCE, TileChoices
from quantstudy.record.vocab import Engine, RowStatus
from quantstudy.report.claims import XClaim, claim_of
from quantstudy.study.sources import HASHED_BY, SourcesHash
from quantstudy.sweep.study_row import StudyRow, fp8_quality, read_row
from quantstudy.zoo.catalogue import ZooEntry

# 2: rows carry where and with which sources they were measured.
# 3: rows carry their studies' tile tuning and GPU-lock wait (`tune_s`, `lock_wait_s`); the
#    provenance names the engine sources the board was made under (rows of others are stale)
#    and the run's throughput sums its rows' study, tuning and lock-wait seconds.
# 4: the provenance keeps the throughput of the earlier runs into the same folder under the
#    same engine sources (`earlier`), so a zoo resumed over several calls says what all took.
# 5: rows carry how long their studies held the GPU lock (`lock_held_s`), and the run's
#    throughput sums it: against the run's wall time, how busy the one GPU lock was.
# 6: each batch keeps its study's speed warnings and what a table needs to mark an x
#    (`report/claims.py`): each engine's IQR / median and the rounds; older rows read without
#    them (None), their x still marked from its own interval and medians.
# 7: rows say how their engine sources were hashed (`Measured.sources_hashed`: "ast", what the
#    code computes; a row without it was hashed by bytes and reads stale) and where their
#    studies' launches took their tiles (`tile_choices`: the shipped table, the store, tuned).
# 8: the run's throughput adds up its rows' `tile_choices` (`Throughput.tile_choices`), so the
#    record says what share of a run's launches were tuned; older boards read without it.
LEADERBOARD_VERSION = 8


class ZooBatch(Section):
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
    # Version 6 on (None: a row written before): the study's own speed warnings for this batch
    # (`speed/stats.py: speed_warnings`), each engine's IQR / median and the timing rounds
    warnings: list[str] | None = None
    fp16_spread: float | None = None
    fp8_spread: float | None = None
    rounds: int | None = None

    def claim(self) -> XClaim:
        """What this x may claim in a table (`report/claims.py`)."""
        return XClaim(
            x=self.x,
            q1=self.x_q1,
            q3=self.x_q3,
            fp16_ms=self.fp16_ms,
            fp8_ms=self.fp8_ms,
            fp16_spread=self.fp16_spread,
            fp8_spread=self.fp8_spread,
            rounds=self.rounds,
        )


class Measured(Section):
    """Where a row was measured: what decides whether a later run may keep it
    (`zoo/row_files.py`)."""

    commit: str | None  # the git commit the study ran at
    created_utc: str  # when the row was written from its study
    # `study/sources.py`: the hash of the code that built and timed its engines (None: its study
    # was not started by a zoo that records it, so the row is stale to any run)
    engine_sources: str | None
    # how `engine_sources` was hashed; a row that does not say was hashed by bytes
    sources_hashed: SourcesHash = "bytes"
    settings: dict[str, Any]  # what the study was asked (`zoo/points.py: row_settings`)
    environment: dict[str, str | None]  # `ENVIRONMENT_KEYS` of the study's record


class ZooRow(StudyRow):
    family: str
    params_m: float | None = None  # parameters, millions
    gmacs: float | None = None  # conv and linear multiply-accumulates per image, billions
    img_size: int | None = None
    fp8_layers: int | None = None  # layers the FP8 engine ran as real FP8 products
    conv_linear_layers: int | None = None  # conv and linear layers the recipe looked at
    batches: list[ZooBatch] = Field(default_factory=list)
    quality_measured: bool = False  # real weights and a quality pass
    build_s: float | None = None  # engine builds, compilation and kernel tuning
    stages: dict[str, float] = Field(default_factory=dict)  # every stage of the run, seconds
    # Of the stages' seconds: Triton tile tuning (its compiles and its config timing, which
    # includes the timing's own waits for the GPU lock), and every wait for the GPU lock
    # (`gpu/timing_lock.py`: with --jobs, another study was timing); None: not recorded
    tune_s: float | None = None
    lock_wait_s: float | None = None
    lock_held_s: float | None = None  # the seconds its studies held the GPU lock
    # where its studies' autotuned launches took their tiles: the shipped table, the machine's
    # store, tuned (`record/timings.py`); None: not recorded (a study before schema 23)
    tile_choices: TileChoices | None = None
    # status no_layer: why FP8 has nothing to speed up, and the recipe whose study gave the
    # figures above (one that does select layers of the model); `recipe` stays the refused one.
    # Status pending or interrupted after a refusal: which fallback is to answer it.
    answer: str | None = None
    x_recipe: str | None = None
    measured: Measured | None = None  # None: not measured yet (or not by a finished study)

    def at(self, batch: int) -> ZooBatch | None:
        return next((b for b in self.batches if b.batch == batch), None)


class Throughput(Section):
    """What one `quantstudy zoo` run measured and how fast: rows it measured (answers of the
    shard, not those kept from committed rows or finished before), its studies' wall time from
    the first start to the last end, and the studies it ran at a time."""

    rows: int
    wall_s: float
    jobs: int
    # Over the rows above whose studies recorded their tile tuning and waits for the GPU lock
    # (`ZooRow.tune_s`, `.lock_wait_s`): their studies' seconds, and of those these two
    study_s: float | None = None
    tune_s: float | None = None
    lock_wait_s: float | None = None
    # Over the same rows where every one says it: the seconds their studies held the GPU lock
    lock_held_s: float | None = None
    # Over the same rows where every one says it: where their studies' autotuned launches took
    # their tiles (`ZooRow.tile_choices` added up); None: a row does not say (before schema 23)
    tile_choices: TileChoices | None = None

    @property
    def rows_per_minute(self) -> float:
        return self.rows / (self.wall_s / 60) if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """Rows a minute, and where the studies' time went (the console and the page)."""
        said = (
            f"{self.rows} rows measured in {self.wall_s / 60:.1f} min with {self.jobs} at a "
            f"time, {self.rows_per_minute:.2f} rows a minute"
        )
        study, tune, wait = self.study_s, self.tune_s, self.lock_wait_s
        if study and tune is not None and wait is not None:
            said += (
                f"; of their studies' {study:.0f} s, {tune:.0f} s tile tuning ({tune / study:.0%}) "
                f"and {wait:.0f} s waiting for the GPU lock ({wait / study:.0%}; the tuning's "
                "config timing counts its own waits)"
            )
        if self.lock_held_s is not None and self.wall_s > 0:
            held = self.lock_held_s
            said += (
                f"; the GPU lock held {held:.0f} s, {held / self.wall_s:.0%} of the wall time "
                "(by the rows' finished studies)"
            )
        if self.tile_choices is not None and launches(self.tile_choices):
            said += f"; {tiles_said(self.tile_choices)}"
        return said


def launches(choices: TileChoices) -> int:
    """The autotuned launches `choices` counts, wherever their tiles came from."""
    return choices.table + choices.store + choices.tuned


def tiles_said(choices: TileChoices) -> str:
    """Where the launches took their tiles, and the share tuned: what a re-run on a bare
    machine with a shipped table (`quant/kernels/table.py`) should keep small."""
    n = launches(choices)
    share = f" ({choices.tuned / n:.0%} of them)" if n else ""
    return (
        f"of their {n} autotuned launches, {choices.table} took their tile from the shipped "
        f"table, {choices.store} from the machine's store and {choices.tuned} were tuned{share}"
    )


def added(choices: list[TileChoices | None]) -> TileChoices | None:
    """`choices` added up; None where any is None (not recorded is not zero) or for none."""
    if not choices or None in choices:
        return None
    return sum((c for c in choices if c is not None), TileChoices(table=0, store=0, tuned=0))


def summed(runs: list[Throughput]) -> Throughput | None:
    """Several runs' throughput as one: their rows over their wall seconds added (each run's
    studies ran in it alone), the most studies any ran at a time, and the seconds of tuning and
    lock wait only where every run recorded them. None for no run."""
    if not runs:
        return None

    def total(values: list[float | None]) -> float | None:
        return None if None in values else round(sum(v or 0.0 for v in values), 1)

    return Throughput(
        rows=sum(r.rows for r in runs),
        wall_s=round(sum(r.wall_s for r in runs), 1),
        jobs=max(r.jobs for r in runs),
        study_s=total([r.study_s for r in runs]),
        tune_s=total([r.tune_s for r in runs]),
        lock_wait_s=total([r.lock_wait_s for r in runs]),
        lock_held_s=total([r.lock_held_s for r in runs]),
        tile_choices=added([r.tile_choices for r in runs]),
    )


class Provenance(Section):
    command: list[str]
    created_utc: str
    models_file: str
    models_sha256: str
    shard: str  # the shard this command ran ("1/1": all)
    weights: str  # the zoo's --weights mode
    device: str
    driver: dict[str, str | None]  # the zoo command's own environment (commit, versions)
    environments: list[dict[str, str | None]]  # each distinct environment the studies recorded
    throughput: Throughput | None = None  # None: nothing measured (a page from committed rows)
    # the runs into this folder before this one, under the same engine sources, oldest first
    earlier: list[Throughput] = Field(default_factory=list)
    # `study/sources.py` of the tree that made the board: a row measured under another hash is
    # stale (its figures are of older engine code); None: not known (a version-2 board)
    engine_sources: str | None = None

    @property
    def runs(self) -> list[Throughput]:
        """Every run into the folder under these engine sources that measured, this one last."""
        return [*self.earlier, *([self.throughput] if self.throughput is not None else [])]


class Leaderboard(Section):
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
    "lab_switches",  # `env/switches.py`, as `switches_said` words; None: none set
)


def recorded_environment(record: StudyRecord) -> dict[str, str | None]:
    """The environment a study recorded (`ENVIRONMENT_KEYS`)."""
    env = record.environment.model_dump(mode="json")
    found = {k: None if env.get(k) is None else str(env[k]) for k in ENVIRONMENT_KEYS}
    return found | {"lab_switches": switches_said(record.environment.lab_switches)}


def collect_row(entry: ZooEntry, folder: Path, stamp: dict[str, Any] | None = None) -> ZooRow:
    """The row of one model from its study's folder, whatever stage its study reached; with
    `stamp` (`Measured`'s engine_sources, settings and the driver's triton), a complete
    record's row says where and with what it was measured."""

    def measure(record: StudyRecord) -> dict[str, object]:
        found = _measured(record)
        if stamp is not None and record.status == "complete":
            env = recorded_environment(record) | {"triton": stamp["triton"]}
            found["measured"] = Measured(
                commit=env["git_commit"],
                created_utc=record.environment.created_utc,
                engine_sources=stamp["engine_sources"],
                sources_hashed=HASHED_BY,  # the marker's (`zoo/sources.py`) is this tree's
                settings=stamp["settings"],
                environment=env,
            )
        return found

    return read_row(folder, ZooRow, {"model": entry.name, "family": entry.family}, measure)


def _measured(record: StudyRecord) -> dict[str, object]:
    """The zoo's own figures from a study record, beyond `sweep/study_row.py`'s."""
    found: dict[str, object] = {
        "weights": record.model.weights,
        "params_m": record.model.num_params / 1e6,
        "gmacs": record.model.macs / 1e9 if record.model.macs is not None else None,
        "img_size": record.preprocessing.input_size[1],
    }
    if record.recipe is not None:
        found["conv_linear_layers"] = len(record.recipe.selected) + len(record.recipe.excluded)
    fp8 = record.engine(Engine.FP8)
    if fp8 is not None:
        found["fp8_layers"] = len(fp8.fp8_real)
    if record.speed is not None:
        ideal = {i.batch: i for i in record.speed.ideal or []}
        found["batches"] = [_zoo_batch(b, ideal.get(b.batch)) for b in record.speed.batches]
    found |= _quality(record)
    if record.timings is not None:
        stages = {s.stage: s.seconds for s in record.timings.stages}
        found["stages"] = stages
        found["build_s"] = round(sum(v for k, v in stages.items() if is_build(k)), 3)
        found |= _spent(record)
    return found


def _zoo_batch(b: BatchSpeed, ideal: IdealSpeed | None) -> ZooBatch:
    """One batch as the board keeps it: its claim's figures (`report/claims.py: claim_of`; x
    and its quartiles kept as `x`, `x_q1`, `x_q3`), the ideal x and the study's warnings."""
    claim = asdict(claim_of(b))
    return ZooBatch(
        batch=b.batch,
        x=claim.pop("x"),
        x_q1=claim.pop("q1"),
        x_q3=claim.pop("q3"),
        ideal_x=ideal.ideal_x if ideal is not None else None,
        ideal_fraction=ideal.fraction if ideal is not None else None,
        warnings=list(b.warnings),
        **claim,
    )


def _spent(record: StudyRecord) -> dict[str, object]:
    """Of the record's stage seconds, the tile tuning's, the waits for the GPU lock and the
    holds of it; none of them for a record written before its stages said so."""
    if record.timings is None or record.schema_version < SPENT_SINCE:
        return {}
    stages = record.timings.stages
    tuned = sum(s.tuning.compile_s + s.tuning.timing_s for s in stages if s.tuning is not None)
    waited = sum(s.lock_wait_s for s in stages if s.lock_wait_s is not None)
    spent: dict[str, object] = {"tune_s": round(tuned, 3), "lock_wait_s": round(waited, 3)}
    if record.schema_version >= HELD_SINCE:
        held = sum(s.lock_held_s for s in stages if s.lock_held_s is not None)
        spent["lock_held_s"] = round(held, 3)
    if record.schema_version >= CHOSEN_SINCE:
        chosen = [s.choices for s in stages if s.choices is not None]
        spent["tile_choices"] = sum(chosen, TileChoices(table=0, store=0, tuned=0))
    return spent


def is_build(stage: str) -> bool:
    """An engine's build, or its compilation and tuning at a batch (`study/speed_only.py`)."""
    return stage.startswith("engine ") and (": build" in stage or ": compile" in stage)


def _quality(record: StudyRecord) -> dict[str, object]:
    """Quality and the decision, only where real weights were scored."""
    q = record.quality
    if q is None or not q.meaningful or record.model.random_weights:
        return {}
    return {"quality_measured": True, **fp8_quality(record)}


def is_answer(row: ZooRow) -> bool:
    """A row that answers the leaderboard's question: timed, or no layer for FP8."""
    return row.status in (RowStatus.COMPLETE, RowStatus.NO_LAYER)
