"""Class 3: Ctrl-C is one line and exit 130, and the same command resumes; a complete study is
never replaced by another configuration without --force; two runs never write one folder."""

from __future__ import annotations

import fcntl
import json
import signal
import time

from tests.reliability._drive import (
    assert_finished,
    assert_one_line_error,
    copy_study,
    leftover_tmp,
    measured,
    quantstudy,
    snapshot,
    start,
    study_args,
)

INTERRUPTED = "quantstudy: interrupted; rerun the same command to resume"


def test_ctrl_c_is_one_line_and_the_same_command_resumes(workspace, study, tmp_path):
    folder = tmp_path / "study"
    run = start(*study_args(folder), cwd=workspace)
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed bound
    while not list((folder / ".cache").glob("stress-fp8-*.pt")):  # halfway: fp32, fp16, fp8 built
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the study wrote no cache entry in time"
        time.sleep(0.1)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    assert err.rstrip().splitlines()[-1] == INTERRUPTED
    assert leftover_tmp(folder) == []
    assert json.loads((folder / "study.json").read_text())["status"] == "partial"
    (folder / ".study.json.dead0000.tmp").write_text("{")  # as a writer killed mid-write leaves
    again = quantstudy(*study_args(folder), cwd=workspace)
    assert_finished(again)
    assert "resumed stress-fp32 from" in again.err and "resumed stress-fp8 from" in again.err
    assert leftover_tmp(folder) == []
    assert json.loads((folder / "study.json").read_text())["status"] == "complete"
    assert measured(folder) == measured(study)  # as if it had never been interrupted


def test_another_configuration_into_a_complete_study_is_refused(workspace, study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    (folder / ".lock").write_text("pid 999999\n")  # left by a run killed with SIGKILL: not held
    before = snapshot(folder)
    r = quantstudy(*study_args(folder, "--seed", "1"), cwd=workspace)
    assert_one_line_error(r, "complete study of another configuration", "seed", "--force")
    assert snapshot(folder) == before


def test_force_replaces_the_complete_study_and_its_report(workspace, study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    r = quantstudy(*study_args(folder, "--seed", "1", "--force"), cwd=workspace)
    assert_finished(r)
    assert "replacing the complete study" in r.err
    record = json.loads((folder / "study.json").read_text())
    assert record["status"] == "complete" and record["config"]["seed"] == 1
    assert "| seed | 1 |" in (folder / "report.md").read_text()


def test_a_folder_in_use_by_another_run_is_refused(workspace, study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    before = snapshot(folder)
    with (folder / ".lock").open("a+") as held:  # what a running study holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("pid 4242\n")
        held.flush()
        r = quantstudy(*study_args(folder), cwd=workspace)
    assert_one_line_error(r, str(folder), "in use by another quantstudy run", "pid 4242")
    assert snapshot(folder) == before
