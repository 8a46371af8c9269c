"""The zoo's throughput, committed rows, answers and page, on the CPU in seconds: the timing lock
serialises two processes' timed sections, studies share a GPU with it, a committed row is kept
only while its engine sources, settings and environment hold, a recipe that selects nothing gets
an answer from a fallback study, random weights never leave a zero layer, and the committed page
is the one the committed rows render."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

from quantstudy.gpu.timing_lock import LOCK_ENV, held_s, timing, waited_s
from quantstudy.model.random_fill import fill_zero_layers
from quantstudy.record import StudyRecord
from quantstudy.record.errors import EXIT_NOTHING_SELECTED
from quantstudy.record.vocab import RowStatus
from quantstudy.study.sources import engine_sources_sha256
from quantstudy.sweep.events import Job
from quantstudy.sweep.local import local_slots
from quantstudy.sweep.point import POINT_FILE, PointStatus
from quantstudy.zoo.answers import FALLBACKS, AnswerProgress, answered, chain, next_refused
from quantstudy.zoo.board import ZooRow, collect_row
from quantstudy.zoo.catalogue import ZooEntry, load_catalogue
from quantstudy.zoo.points import ZooOptions, row_settings, zoo_point
from quantstudy.zoo.row_files import Current, read_rows, stale_reasons, write_row
from quantstudy.zoo.run import write_board, write_leaderboard

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "study_example.json"
ROWS = REPO / "docs" / "results" / "zoo"
PAGE = REPO / "docs" / "results" / "zoo.md"
BOARD_ARGV = ("quantstudy", "zoo", "--rows", "docs/results/zoo", "--page", "docs/results/zoo.md")

HOLDER = """
import json, os, sys, time
from quantstudy.gpu.timing_lock import timing
spans = []
for _ in range(4):
    with timing():
        with timing():  # re-entrant: a harness round whose kernel tunes
            start = time.monotonic()
            time.sleep(0.05)
            spans.append((start, time.monotonic()))
    time.sleep(0.01)
json.dump(spans, open(sys.argv[1], "w"))
"""


def test_the_lock_keeps_two_processes_timed_sections_apart(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "gpu.lock"))
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / f"{i}.json")])
        for i in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    a, b = (json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2))
    assert len(a) == len(b) == 4
    overlaps = [(s, t) for s in a for t in b if s[0] < t[1] and t[0] < s[1]]
    assert not overlaps, overlaps


def test_without_the_variable_timing_is_a_no_op(tmp_path, monkeypatch):
    """Unset, the block runs (nested too) and neither a wait nor a hold is counted; set, the
    same block takes the lock file and counts its hold."""
    monkeypatch.delenv(LOCK_ENV, raising=False)
    before = (waited_s(), held_s())
    ran = []
    with timing(), timing():
        ran.append(True)
    assert ran == [True] and (waited_s(), held_s()) == before
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "gpu.lock"))
    with timing(), timing():
        time.sleep(0.01)
    assert held_s() >= before[1] + 0.01 and (tmp_path / "gpu.lock").is_file()


def test_jobs_share_one_gpu_behind_one_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    slots = local_slots("cuda", None, jobs=3, lock_dir=tmp_path)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0"] * 3
    assert {s.env[LOCK_ENV] for s in slots} == {str(tmp_path / ".timing-gpu0.lock")}
    assert LOCK_ENV not in local_slots("cuda", None)[0].env  # one study: no lock


def test_engine_sources_hash_follows_the_covered_files_only(tmp_path):
    for sub in ("quant", "study"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "a.py").write_text("x = 1\n")
    before = engine_sources_sha256(tmp_path)
    (tmp_path / "study" / "a.py").write_text("x = 2\n")  # orders stages: not covered
    assert engine_sources_sha256(tmp_path) == before
    (tmp_path / "quant" / "a.py").write_text("x = 2\n")  # builds engines
    assert engine_sources_sha256(tmp_path) != before


def _point(job: Job, code: int, status: str, error: str | None) -> PointStatus:
    return PointStatus(
        folder=job.folder, settings=job.point, argv=["q"], status=status, attempts=1,  # type: ignore[arg-type]
        returncode=code, error=error, wall_s=11.5, host="h", started_utc="t",
    )  # fmt: skip


def _folder(
    out: Path,
    job: Job,
    code: int,
    record: StudyRecord | None = None,
    status: str = "failed",
    error: str | None = "recipe selects no layer",
) -> None:
    folder = out / job.folder
    folder.mkdir(parents=True)
    if record is not None:
        status, error = "complete", None
    point = _point(job, code, status, error)
    (folder / POINT_FILE).write_text(point.model_dump_json())
    if record is not None:
        (folder / "study.json").write_text(record.model_dump_json())


def _speed_record() -> StudyRecord:
    full = StudyRecord.model_validate_json(FIXTURE.read_text())
    return full.model_copy(
        update={
            "model": full.model.model_copy(update={"weights": "random", "random_weights": True})
        }
    )


def test_a_recipe_that_selects_nothing_gets_an_answer_with_a_fallbacks_x(tmp_path):
    entry = ZooEntry(name="resnet18", family="resnet")
    point = zoo_point(entry, ZooOptions(data=tmp_path, out=tmp_path), "cuda")
    job = Job(point, point.folder_name)
    steps = chain(job)
    assert [s.point.config.recipe for s in steps] == [None, *FALLBACKS]
    _folder(tmp_path, job, EXIT_NOTHING_SELECTED)
    assert next_refused(job, tmp_path) == steps[1]  # the first fallback runs next
    _folder(tmp_path, steps[1], 0, _speed_record())
    assert next_refused(job, tmp_path) is None
    stamp = {"engine_sources": "abc", "settings": row_settings(point), "triton": "3.6.0"}
    rows = [(s, collect_row(entry, tmp_path / s.folder, stamp)) for s in steps]
    row = answered(tmp_path, rows)
    assert row.status == RowStatus.NO_LAYER and row.x_recipe == FALLBACKS[0]
    assert row.recipe == "generic_default" and row.batches  # the refused recipe, the fallback's x
    assert row.answer is not None and "no layer where FP8 pays under generic_default" in row.answer
    assert row.measured is not None and row.measured.engine_sources == "abc"


def _refused_chain(out: Path) -> tuple[ZooEntry, list[Job]]:
    """resnet18 with its default recipe refused (exit 6), its fallbacks not run yet."""
    entry = ZooEntry(name="resnet18", family="resnet")
    point = zoo_point(entry, ZooOptions(data=out, out=out), "cuda")
    steps = chain(Job(point, point.folder_name))
    _folder(out, steps[0], EXIT_NOTHING_SELECTED)
    return entry, steps


def _answer(out: Path, entry: ZooEntry, steps: list[Job]) -> ZooRow:
    return answered(out, [(s, collect_row(entry, out / s.folder)) for s in steps])


def test_a_refusal_whose_fallback_has_not_run_is_pending_never_failed(tmp_path):
    entry, steps = _refused_chain(tmp_path)
    row = _answer(tmp_path, entry, steps)
    assert (row.status, row.error) == (RowStatus.PENDING, None)
    assert row.answer == (
        "generic_default selects no layer; its fallback generic_dense_convs runs after the list"
    )
    _folder(tmp_path, steps[1], 130, status="interrupted", error=None)  # the run was stopped
    row = _answer(tmp_path, entry, steps)
    assert row.status == RowStatus.INTERRUPTED and row.answer is not None
    assert row.answer.endswith("its fallback generic_dense_convs was stopped")
    options = ZooOptions(data=tmp_path, out=tmp_path)
    board = write_leaderboard(options, load_catalogue(), [(entry, steps[0])], tmp_path, "cuda")
    assert (board.counts["interrupted"], board.counts["failed"]) == (1, 0)
    assert "| interrupted: generic_default selects no layer;" in (tmp_path / "zoo.md").read_text()
    [said] = csv.DictReader(io.StringIO((tmp_path / "zoo.csv").read_text()))
    assert (said["status"], said["error"], said["answer"]) == ("interrupted", "", row.answer)


def test_a_fallback_that_fails_makes_a_failed_row_with_its_error(tmp_path):
    entry, steps = _refused_chain(tmp_path)
    _folder(tmp_path, steps[1], 1, error="RuntimeError: out of memory")
    row = _answer(tmp_path, entry, steps)
    assert row.status == RowStatus.FAILED and row.answer is None
    assert row.error == (
        "generic_default selects no layer; generic_dense_convs: RuntimeError: out of memory"
    )


def test_the_console_says_a_refusal_is_an_answer_whose_fallback_runs_next(tmp_path):
    _, steps = _refused_chain(tmp_path)
    shown = io.StringIO()
    progress = AnswerProgress(Console(file=shown, width=400), total=3)
    progress.counts["running"] = 3
    progress.finished(steps[0], _point(steps[0], EXIT_NOTHING_SELECTED, "failed", "no layer"))
    last = steps[-1]  # generic_all refused: no fallback is left, so it failed
    progress.finished(last, _point(last, EXIT_NOTHING_SELECTED, "failed", "selects no layer"))
    progress.finished(steps[1], _point(steps[1], 1, "failed", "RuntimeError: boom"))
    lines = shown.getvalue().splitlines()
    assert lines[0].startswith("no layer resnet18") and "FAILED" not in lines[0]
    assert lines[0].endswith(
        "generic_default selects no layer of resnet18; its fallback generic_dense_convs runs "
        "after the list"
    )
    assert lines[1].startswith("FAILED resnet18") and lines[2].endswith("RuntimeError: boom")
    assert progress.counts["no layer"] == 1 and progress.counts["failed"] == 2


def test_the_page_marks_rows_of_other_engine_sources_stale(tmp_path):
    rows = read_rows(ROWS)
    fresh, old = rows["resnet50"], rows["dla34"]
    assert fresh.measured is not None and old.measured is not None
    now = fresh.measured.model_copy(update={"engine_sources": engine_sources_sha256()})
    then = old.measured.model_copy(update={"engine_sources": "0" * 64})
    write_row(tmp_path / "rows", fresh.model_copy(update={"measured": now}))
    write_row(tmp_path / "rows", old.model_copy(update={"measured": then}))
    page = tmp_path / "zoo.md"
    options = ZooOptions(data=Path("."), out=tmp_path, rows=tmp_path / "rows", page=page)
    assert write_board(options) == 0
    text = page.read_text()
    assert "models (2 complete (1 of them stale), 55 pending)." in text
    [dla] = [line for line in text.splitlines() if line.startswith("| dla34 |")]
    [resnet] = [line for line in text.splitlines() if line.startswith("| resnet50 |")]
    assert dla.endswith("(stale: engine sources changed since) |")
    assert "stale" not in resnet and "lab switches" not in resnet


def test_a_row_names_the_lab_switches_its_study_ran_under(tmp_path):
    """`recorded_environment` keeps the study's switches, and the page says them."""
    from quantstudy.env.switches import GEMM_CONFIGS
    from quantstudy.zoo.board import recorded_environment

    record = _speed_record()
    assert recorded_environment(record)["lab_switches"] is None
    env = record.environment.model_copy(update={"lab_switches": {GEMM_CONFIGS: "6"}})
    switched = record.model_copy(update={"environment": env})
    assert recorded_environment(switched)["lab_switches"] == f"{GEMM_CONFIGS}=6"
    row = read_rows(ROWS)["resnet50"]
    assert row.measured is not None
    said = dict(row.measured.environment) | {"lab_switches": f"{GEMM_CONFIGS}=6"}
    measured = row.measured.model_copy(update={"environment": said})
    write_row(tmp_path / "rows", row.model_copy(update={"measured": measured}))
    page = tmp_path / "zoo.md"
    options = ZooOptions(data=Path("."), out=tmp_path, rows=tmp_path / "rows", page=page)
    assert write_board(options) == 0
    [line] = [x for x in page.read_text().splitlines() if x.startswith("| resnet50 |")]
    assert f"(lab switches {GEMM_CONFIGS}=6)" in line


def test_a_committed_row_is_kept_only_while_what_measured_it_holds(tmp_path):
    rows = read_rows(ROWS)
    row = rows["resnet50"]
    assert row.measured is not None and row.measured.commit  # each row names its commit
    # as if hashed as this tree hashes (a row hashed by bytes is stale: test_zoo_staleness.py)
    row = row.model_copy(
        update={"measured": row.measured.model_copy(update={"sources_hashed": "ast"})}
    )
    then = Current(row.measured.engine_sources or "", dict(row.measured.environment))
    settings = dict(row.measured.settings)
    assert stale_reasons(row, settings, then) == []
    assert (
        "engine sources changed"
        in stale_reasons(row, settings, Current("other", then.environment))[0]
    )
    h200 = Current(then.engine_sources, then.environment | {"gpu_name": "NVIDIA H200"})
    assert stale_reasons(row, settings, h200) == [
        "gpu_name NVIDIA H100 80GB HBM3 measured, NVIDIA H200 here"
    ]
    assert stale_reasons(row, settings | {"batches": [1, 32]}, then) == [
        "settings changed: batches"
    ]
    bound = Current(then.engine_sources, then.environment | {"lab_switches": "X=6"})
    assert stale_reasons(row, settings, bound) == ["lab_switches None measured, X=6 here"]
    failed = row.model_copy(update={"status": RowStatus.FAILED})
    assert stale_reasons(failed, settings, then) == ["status failed"]
    write_row(tmp_path, row)
    assert read_rows(tmp_path) == {"resnet50": row}


def test_random_weights_fill_a_head_timm_zeroes():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(4 * 4 * 4, 10))
    nn.init.zeros_(model[2].weight)
    conv = model[0].weight.clone()
    assert fill_zero_layers(model, seed=0) == ["2"]
    assert bool(model[2].weight.any()) and torch.equal(model[0].weight, conv)
    x = torch.randn(2, 3, 4, 4)
    logits = model(x)
    assert not torch.allclose(logits[0], logits[1])  # the images are told apart again


@pytest.mark.parametrize("page", [PAGE])
def test_the_committed_page_is_the_one_the_committed_rows_render(page, tmp_path, monkeypatch):
    """Rendered under the engine sources the page names, not this tree's: a kernel edit stales
    the rows (the next GPU run measures them again) without making the page a lie, so the page
    need not be rendered again at each edit; what it must match is its rows."""
    import re

    import quantstudy.zoo.run as zoo_run

    named = re.search(r"Engine sources of this page .*: ([0-9a-f]{12})\.", page.read_text())
    if named:  # the full hash of a row measured under it, else none of the rows was
        hashes = {r.measured.engine_sources for r in read_rows(ROWS).values() if r.measured}
        full = [h for h in hashes if h and h.startswith(named[1])]
        monkeypatch.setattr(zoo_run, "engine_sources_sha256", lambda: (full or [named[1]])[0])
    out = tmp_path / "zoo.md"
    options = ZooOptions(data=Path("."), out=tmp_path, rows=ROWS, page=out, command=BOARD_ARGV)
    assert write_board(options) == 0
    assert out.read_text() == page.read_text(), "rerun: " + " ".join(BOARD_ARGV)
    assert (tmp_path / "zoo.png").stat().st_size > 0
    text = out.read_text()
    best = max(read_rows(ROWS).values(), key=lambda r: r.at(128).x if r.at(128) else 0)
    assert f"most {best.family} (" in text  # named from the rows, not typed


def test_a_row_is_written_as_its_study_ends_once_it_answers(tmp_path):
    """`row_writer`: the refused study's end writes nothing (its answer waits for the fallback);
    the fallback's end writes the model's no-layer row, before the run's own end."""
    import importlib.metadata

    from quantstudy.zoo.row_files import ROW_ENVIRONMENT
    from quantstudy.zoo.run import row_writer
    from quantstudy.zoo.sources import write_marker

    entry, steps = _refused_chain(tmp_path)
    rows = tmp_path / "rows"
    options = ZooOptions(data=tmp_path, out=tmp_path, rows=rows)
    env = _speed_record().environment.model_dump()
    try:  # a row's Triton is this machine's (the study record's is not kept), as the zoo's
        env["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        env["triton"] = None
    current = Current("abc", {k: env.get(k) for k in ROW_ENVIRONMENT})
    write = row_writer(options, [(entry, steps[0])], tmp_path, current, Console(file=io.StringIO()))
    write(steps[0])
    assert not rows.exists()  # pending: the fallback runs after the list
    _folder(tmp_path, steps[1], 0, _speed_record())
    for step in steps[:2]:
        write_marker(tmp_path / step.folder, "abc")
    write(steps[1])
    assert read_rows(rows)["resnet18"].status == RowStatus.NO_LAYER
