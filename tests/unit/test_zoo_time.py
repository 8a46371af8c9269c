"""Where a zoo study's time goes: each stage's tile tuning, waits for the GPU lock and holds of
it, in the study record (`study/stage_timer.py`, schemas 19 and 22), the zoo row and the run's
throughput line.

The lock is taken by a second process, as a second study of `--jobs` would; the tuning rows are
written through the tuning's own log (`quant/kernels/tuning.py: _log`), as a tuned launch does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from quantstudy.gpu.timing_lock import LOCK_ENV, timing
from quantstudy.quant.kernels import tuning
from quantstudy.record import StageTime, StudyRecord, TimingsSection
from quantstudy.record.load import load_record
from quantstudy.record.timings import StageTuning, TileChoices
from quantstudy.study.stage_timer import StageTimer
from quantstudy.zoo.board import Leaderboard, Provenance, Throughput, ZooRow, collect_row, summed
from quantstudy.zoo.catalogue import ZooEntry
from quantstudy.zoo.markdown import render_markdown
from quantstudy.zoo.throughput import Timed, earlier_runs, measured_throughput

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "study_example.json"

HOLDER = """
import sys, time
from pathlib import Path
from quantstudy.gpu.timing_lock import timing
with timing():
    Path(sys.argv[1]).write_text("held")
    time.sleep(float(sys.argv[2]))
"""


def test_a_stage_says_how_long_it_waited_for_a_lock_another_process_held(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "gpu.lock"))
    held = tmp_path / "held"
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(held), "2.0"])
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.exists(), "the other process never took the lock"
        timer = StageTimer(echo=None)
        with timer.stage("timing"), timing():
            time.sleep(0.3)  # held while timing
        with timer.stage("report"), timing():  # the lock is free again: no wait
            pass
    finally:
        assert other.wait(timeout=60) == 0
    waited, free = timer.section().stages
    # the other process held the lock 2 s from writing its file; this one asked for it after
    # it saw the file, so it waited for most of that (not all: the poll and a loaded host take some)
    assert waited.lock_wait_s is not None and 0.5 <= waited.lock_wait_s <= waited.seconds
    assert free.lock_wait_s is None and free.tuning is None
    assert waited.lock_held_s is not None and 0.3 <= waited.lock_held_s <= waited.seconds
    assert free.lock_held_s is not None and free.lock_held_s < waited.lock_held_s


def test_without_the_lock_nothing_is_waited_or_held(monkeypatch):
    """One study alone (no `QUANTSTUDY_TIMING_LOCK`): the block is a no-op, not a zero hold."""
    monkeypatch.delenv(LOCK_ENV, raising=False)
    timer = StageTimer(echo=None)
    with timer.stage("timing"), timing():
        time.sleep(0.01)
    [stage] = timer.section().stages
    assert (stage.lock_wait_s, stage.lock_held_s) == (None, None)


def test_a_stage_adds_up_the_tile_tuning_inside_it(monkeypatch):
    monkeypatch.setattr(tuning, "TUNE_LOG", [])
    monkeypatch.delenv("QUANTSTUDY_TUNE_LOG", raising=False)
    monkeypatch.delenv(LOCK_ENV, raising=False)
    tuning._log({"kernel": "fp8_product", "configs": 30, "compile_s": 1.0, "tune_s": 0.5})
    timer = StageTimer(echo=None)
    with timer.stage("engine fp8: compile at batch 1"):
        for kernel, configs in (("fp8_product", 24), ("conv_kxk", 12), ("fp8_product", 20)):
            row = {"kernel": kernel, "configs": configs, "compile_s": 1.25, "tune_s": 0.5}
            tuning._log(row)
    with timer.stage("timing"):
        pass
    compiled, timed = timer.section().stages
    # the row logged before the stage is not the stage's
    assert compiled.tuning == StageTuning(launches=3, configs=56, compile_s=3.75, timing_s=1.5)
    assert timed.tuning is None and compiled.lock_wait_s is None


def _record(stages: list[StageTime], version: int) -> StudyRecord:
    full = StudyRecord.model_validate_json(FIXTURE.read_text())
    timings = TimingsSection(stages=stages, total_s=100.0)
    return full.model_copy(update={"schema_version": version, "timings": timings})


def _row(tmp_path: Path, record: StudyRecord) -> ZooRow:
    folder = tmp_path / f"v{record.schema_version}"
    folder.mkdir()
    (folder / "study.json").write_text(record.model_dump_json())
    load_record(folder / "study.json")  # reads back through the one record reader
    return collect_row(ZooEntry(name="resnet50", family="resnet"), folder)


def test_a_row_and_the_runs_line_say_how_much_was_tuning_and_lock_wait(tmp_path):
    tuned = StageTuning(launches=26, configs=666, compile_s=22.9, timing_s=16.8)
    stages = [
        StageTime(stage="engine fp8: build", seconds=1.0),
        StageTime(stage="engine fp8: compile at batch 1", seconds=27.6, tuning=tuned),
        StageTime(stage="timing", seconds=10.0, lock_wait_s=4.0),
    ]
    row = _row(tmp_path, _record(stages, 19))
    assert (row.tune_s, row.lock_wait_s) == (39.7, 4.0)
    plain = [s.model_copy(update={"tuning": None, "lock_wait_s": None}) for s in stages]
    untuned = _row(tmp_path, _record(plain, 18))  # before schema 19: not recorded, not zero
    assert (untuned.tune_s, untuned.lock_wait_s) == (None, None)
    # the untuned row counts as a row measured, not in the seconds its record does not split
    line = measured_throughput([row, untuned], Timed(frozenset(), 60.0, 4)).line()
    assert line == (
        "2 rows measured in 1.0 min with 4 at a time, 2.00 rows a minute; of their studies' "
        "100 s, 40 s tile tuning (40%) and 4 s waiting for the GPU lock (4%; the tuning's config "
        "timing counts its own waits)"
    )


def test_the_runs_line_says_how_busy_the_gpu_lock_was(tmp_path):
    """Schema 22 stages say how long they held the lock; the run's line puts their sum against
    its wall time. A row whose record does not say it leaves the line without the share."""
    stages = [
        StageTime(stage="engine fp8: compile at batch 1", seconds=30.0, lock_held_s=9.0),
        StageTime(stage="timing", seconds=12.0, lock_wait_s=3.0, lock_held_s=12.0),
    ]
    held = _row(tmp_path, _record(stages, 22))
    assert (held.lock_wait_s, held.lock_held_s) == (3.0, 21.0)
    older = _row(tmp_path, _record(stages, 21))  # before schema 22: not read, not zero
    assert older.lock_held_s is None
    line = measured_throughput([held, held], Timed(frozenset(), 60.0, 4)).line()
    assert line.endswith(
        "; the GPU lock held 42 s, 70% of the wall time (by the rows' finished studies)"
    )
    assert "lock held" not in measured_throughput([held, older], Timed(frozenset(), 60.0, 4)).line()


def test_the_page_says_each_rows_tuning_and_lock_wait(tmp_path):
    tuned = StageTuning(launches=2, configs=40, compile_s=9.6, timing_s=3.0)
    stages = [
        StageTime(stage="engine fp8: compile at batch 1", seconds=20.0, tuning=tuned),
        StageTime(stage="timing", seconds=9, lock_wait_s=6.2),
    ]
    row = _row(tmp_path, _record(stages, 19))
    provenance = Provenance(
        command=["quantstudy", "zoo"], created_utc="t", models_file="models.yaml",
        models_sha256="0" * 64, shard="1/1", weights="random", device="cuda", driver={},
        environments=[],
    )  # fmt: skip
    board = Leaderboard(provenance=provenance, batches=[1, 128], counts={}, rows=[row])
    text = render_markdown(board)
    assert "| s: process / study / build (tuning, lock wait) |" in text
    [line] = [t for t in text.splitlines() if t.startswith("| resnet50 |")]
    assert "| - / 100 / 20 (tuning 13, lock 6) |" in line


def test_runs_into_one_folder_add_up_under_the_same_engine_sources(tmp_path):
    """A zoo resumed over several calls: each leaderboard keeps the earlier runs' throughput
    while the engine sources hold, and their sum is rows over the calls' wall seconds added
    (each call's studies ran inside it); seconds split into tuning only where every run did."""
    first = Throughput(rows=3, wall_s=120.0, jobs=4, study_s=400.0, tune_s=100.0, lock_wait_s=20.0)
    second = Throughput(rows=5, wall_s=180.0, jobs=4, study_s=600.0, tune_s=150.0, lock_wait_s=30.0)
    total = summed([first, second])
    assert total is not None and (total.rows, total.wall_s, total.jobs) == (8, 300.0, 4)
    assert total.rows_per_minute == 1.6 and (total.study_s, total.tune_s) == (1000.0, 250.0)
    older = second.model_copy(update={"study_s": None, "tune_s": None, "lock_wait_s": None})
    mixed = summed([first, older])
    assert mixed is not None and mixed.tune_s is None and summed([]) is None
    holding = [t.model_copy(update={"lock_held_s": 30.0}) for t in (first, second)]
    both = summed(holding)
    assert both is not None and both.lock_held_s == 60.0
    assert summed([holding[0], second]).lock_held_s is None  # type: ignore[union-attr]

    provenance = Provenance(
        command=["quantstudy", "zoo"], created_utc="t", models_file="models.yaml",
        models_sha256="0" * 64, shard="1/1", weights="random", device="cuda", driver={},
        environments=[], throughput=second, earlier=[first], engine_sources="a" * 64,
    )  # fmt: skip
    board = tmp_path / "zoo.json"
    board.write_text(
        Leaderboard(provenance=provenance, batches=[1], counts={}, rows=[]).model_dump_json()
    )
    assert earlier_runs(board, "a" * 64) == [first, second]
    assert earlier_runs(board, "b" * 64) == []  # other engine code: its rows are measured again
    board.write_text("{not json")
    assert earlier_runs(board, "a" * 64) == [] and earlier_runs(tmp_path / "none", "a") == []
    text = render_markdown(Leaderboard(provenance=provenance, batches=[1], counts={}, rows=[]))
    assert (
        "The 2 runs into this folder under these engine sources: 8 rows measured in 5.0 min" in text
    )


def test_the_run_and_the_page_say_what_share_of_the_launches_was_tuned(tmp_path):
    """Schema 23 stages say where their launches took their tiles; the run's throughput adds
    them up over its rows (so zoo.json says the share tuned, the measure of a re-run with a
    shipped table), and the page adds them up over every row that says it."""
    stages = [
        StageTime(
            stage="engine fp8: compile at batch 1", seconds=30.0,
            choices=TileChoices(table=14, store=2, tuned=1),
        ),
        StageTime(
            stage="engine fp8: compile at batch 128", seconds=20.0,
            choices=TileChoices(table=3, store=0, tuned=0),
        ),
        StageTime(stage="timing", seconds=12.0),
    ]  # fmt: skip
    row = _row(tmp_path, _record(stages, 23))
    assert row.tile_choices == TileChoices(table=17, store=2, tuned=1)
    older = _row(tmp_path, _record(stages, 22))  # before schema 23: not recorded, not zero
    assert older.tile_choices is None
    older = older.model_copy(update={"model": "resnet18"})
    run = measured_throughput([row, row], Timed(frozenset(), 60.0, 4))
    assert run.tile_choices == TileChoices(table=34, store=4, tuned=2)
    assert run.line().endswith(
        "; of their 40 autotuned launches, 34 took their tile from the shipped table, 4 from "
        "the machine's store and 2 were tuned (5% of them)"
    )
    mixed = measured_throughput([row, older], Timed(frozenset(), 60.0, 4))
    assert mixed.tile_choices is None and "autotuned" not in mixed.line()
    total = summed([run, run])
    assert total is not None and total.tile_choices == TileChoices(table=68, store=8, tuned=4)
    assert summed([run, mixed]).tile_choices is None  # type: ignore[union-attr]

    provenance = Provenance(
        command=["quantstudy", "zoo"], created_utc="t", models_file="models.yaml",
        models_sha256="0" * 64, shard="1/1", weights="random", device="cuda", driver={},
        environments=[], throughput=run,
    )  # fmt: skip
    board = Leaderboard(provenance=provenance, batches=[1], counts={}, rows=[row, older])
    read = Leaderboard.model_validate_json(board.model_dump_json())
    assert read.provenance.throughput == run  # the record keeps the run's count
    text = render_markdown(read)
    assert f"This run: {run.line()}." in text
    assert (
        "The rows' studies (1 row that says it): of their 20 autotuned launches, 17 took their "
        "tile from the shipped table, 2 from the machine's store and 1 were tuned (5% of them)."
    ) in text
    untuned = Leaderboard(provenance=provenance, batches=[1], counts={}, rows=[older])
    assert "The rows' studies" not in render_markdown(untuned)
