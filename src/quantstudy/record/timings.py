"""Wall time per stage of one study run: where a study's minutes went."""

from __future__ import annotations

from quantstudy.record.base import Section

SPENT_SINCE = 19  # the schema version whose stages say their tile tuning and lock waits
HELD_SINCE = 22  # the schema version whose stages say how long they held the GPU lock
CHOSEN_SINCE = 23  # the schema version whose stages say where their tiles came from


class StageTuning(Section):
    """The Triton tile tuning inside one stage (`quant/kernels/tuning.py`: `TUNE_LOG`, added up
    as its `summary` does, over every kernel): each launch tuned compiles its pruned configs,
    then times them."""

    launches: int
    configs: int  # compiled and timed, over the launches
    compile_s: float
    timing_s: float  # the configs' timing, with its waits for the GPU lock


class TileChoices(Section):
    """Where the autotuned launches first made in one stage took their configs
    (`quant/kernels/tuning.py`: `CHOICE_LOG`, each distinct launch once per process): the
    shipped table of this GPU (`quant/kernels/table.py`), this machine's store of earlier
    tunes, or tuned here (those are `StageTuning.launches`)."""

    table: int
    store: int
    tuned: int

    def __add__(self, other: TileChoices) -> TileChoices:
        return TileChoices(
            table=self.table + other.table,
            store=self.store + other.store,
            tuned=self.tuned + other.tuned,
        )


class StageTime(Section):
    """One stage, timed with a monotonic clock around the stage's code."""

    stage: str  # e.g. "load", "calibrate", "engine fp16: build", "engine fp16: run", "score"
    seconds: float
    # Of `seconds` (schema 19): the tile tuning inside the stage (None: nothing tuned), and the
    # seconds spent waiting for the GPU lock (`gpu/timing_lock.py`; None: no wait); (schema
    # 22) the seconds the stage held it, keeping the GPU from the other studies (None: not held)
    tuning: StageTuning | None = None
    lock_wait_s: float | None = None
    lock_held_s: float | None = None
    # (schema 23) where the stage's launches took their tiles (None: it chose none)
    choices: TileChoices | None = None


class TimingsSection(Section):
    """Stages of the run that wrote this record, in the order they ran.

    A resumed study times only its own run: stages restored from the stage cache take their
    (short) reload time.
    """

    stages: list[StageTime]
    total_s: float  # from the start of the run to the end of the last stage
