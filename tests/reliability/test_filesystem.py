"""Class 2: filesystem faults end in one line naming the path and what to do; nothing finished
is lost, no temporary file is left, and what a study writes is readable by others."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
from pathlib import Path

import pytest
import torch

from tests.reliability._drive import (
    assert_finished,
    assert_one_line_error,
    copy_study,
    files_under,
    leftover_tmp,
    measured,
    quantstudy,
    snapshot,
    study_args,
)


def test_out_naming_a_file_is_refused_and_the_file_kept(workspace, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    r = quantstudy(*study_args(target), cwd=workspace)
    assert_one_line_error(r, str(target), "is a file")
    assert target.read_text() == "mine\n"


def test_out_below_a_file_is_refused(workspace, tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    r = quantstudy(*study_args(tmp_path / "notes.txt" / "study"), cwd=workspace)
    assert_one_line_error(r, "notes.txt is a file")


def test_out_in_a_read_only_system_folder_is_one_line(workspace):
    r = quantstudy(*study_args("/sys/quantstudy-reliability/study"), cwd=workspace)
    assert_one_line_error(r, "/sys", "--out")


def test_out_in_proc_is_one_line(workspace):
    """/proc exists and root may write it by its mode bits, but it holds no new folders: the
    mkdir fails with ENOENT, which preflight's probe turns into one line."""
    r = quantstudy(*study_args("/proc/quantstudy-reliability"), cwd=workspace)
    assert_one_line_error(r, "/proc/quantstudy-reliability", "cannot be created", "--out")


def test_lock_file_that_is_a_folder_is_one_line(workspace, tmp_path):
    (tmp_path / "study" / ".lock").mkdir(parents=True)  # EISDIR on opening the lock
    r = quantstudy(*study_args(tmp_path / "study"), cwd=workspace)
    assert_one_line_error(r, str(tmp_path / "study" / ".lock"), "--out")


@pytest.mark.parametrize("where", ["file", "below-file", "proc"])
def test_a_cache_variable_that_cannot_hold_a_folder_names_the_variable(workspace, tmp_path, where):
    """A fault below a cache folder is fixed by its variable, not by --out."""
    (tmp_path / "afile").write_text("mine\n")
    root = {
        "file": tmp_path / "afile",
        "below-file": tmp_path / "afile" / "stats",
        "proc": Path("/proc/quantstudy-reliability"),
    }[where]
    r = quantstudy(
        *study_args(tmp_path / "study"),
        cwd=workspace,
        env={"QUANTSTUDY_CALIB_STATS_DIR": str(root)},
    )
    line = assert_one_line_error(r, "$QUANTSTUDY_CALIB_STATS_DIR", str(root))
    assert "--out" not in line
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert not (tmp_path / "study").exists()


def test_a_record_path_that_is_a_folder_is_one_line_and_the_cache_kept(workspace, study, tmp_path):
    """EISDIR on the final rename: the study's cache entries stay for the rerun."""
    folder = copy_study(study, tmp_path / "study")
    (folder / "study.json").unlink()
    (folder / "study.json").mkdir()
    cached = snapshot(folder / ".cache")
    r = quantstudy(*study_args(folder), cwd=workspace)
    assert_one_line_error(r, str(folder / "study.json"), "folder where a file belongs")
    assert leftover_tmp(folder) == []
    assert {k: v for k, v in snapshot(folder / ".cache").items() if k in cached} == cached


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder_is_one_line(workspace, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        r = quantstudy(*study_args(locked / "study"), cwd=workspace)
    finally:
        locked.chmod(0o755)
    assert_one_line_error(r, str(locked), "--out")
    assert not (locked / "study").exists()


def _file_size_limit(limit: int):
    """A full disk, as the process sees it: writes past `limit` bytes fail (EFBIG)."""

    def apply() -> None:
        os.umask(0o022)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_on_rerun_keeps_the_complete_study(workspace, study, tmp_path):
    folder = copy_study(study, tmp_path / "study")
    before = snapshot(folder)
    r = quantstudy(*study_args(folder), cwd=workspace, preexec=_file_size_limit(4096))
    assert_one_line_error(r, str(folder / "study.json"), "rerun the same command")
    assert leftover_tmp(folder) == []
    assert snapshot(folder) == before  # the complete study is untouched


def test_disk_full_mid_run_keeps_what_was_finished_and_resumes(workspace, study, tmp_path):
    """The disk fills at the first cache entry: a stress pass's logits (29 inputs x 1000
    classes of float32, 117 KB) pass the 60 KB limit while the partial record (17 KB) does not.
    The finished stages stay in the record (calibration); cache entries kept across a fault are
    the Ctrl-C case's (`test_interruption.py`), as every later entry is smaller than this one."""
    folder = tmp_path / "study"
    r = quantstudy(*study_args(folder), cwd=workspace, preexec=_file_size_limit(60_000))
    assert_one_line_error(r, str(folder / ".cache"), "rerun the same command to resume")
    assert leftover_tmp(folder) == []
    partial = json.loads((folder / "study.json").read_text())
    assert partial["status"] == "partial" and partial["calibration"] is not None
    assert not list((folder / ".cache").glob("*.pt"))  # the entry that did not fit is not left
    # space again: the same command completes the study
    again = quantstudy(*study_args(folder), cwd=workspace)
    assert_finished(again)
    assert measured(folder) == measured(study)  # as if the disk had never filled


def test_corrupt_cache_entries_are_recomputed_and_the_study_stays_complete(
    workspace, study, tmp_path
):
    folder = copy_study(study, tmp_path / "study")
    cache = folder / ".cache"
    truncated = next(cache.glob("rows-00000000-*.pt"))  # the held-out pass's per-image rows
    truncated.write_bytes(truncated.read_bytes()[:100])
    emptied = next(cache.glob("stress-fp32-*.pt"))
    emptied.write_bytes(b"")
    replaced = next(cache.glob("stress-fp16-*.pt"))
    torch.save({"not": "a tensor"}, replaced)
    r = quantstudy(*study_args(folder), cwd=workspace)
    assert_finished(r)
    for path in (truncated, emptied, replaced):
        assert f"cache entry {path} is" in r.err and "recomputing it" in r.err
        assert _tensors(torch.load(path, weights_only=True))
    assert json.loads((folder / "study.json").read_text())["status"] == "complete"
    assert leftover_tmp(folder) == []
    assert measured(folder) == measured(study)  # the recomputed entries give the same numbers


def test_study_files_are_readable_by_others(study):
    for name in files_under(study):
        mode = stat.S_IMODE((study / name).stat().st_mode)
        assert mode == 0o644, f"{name} has mode {oct(mode)} under umask 022"


def test_a_finished_study_leaves_no_temporary_file(study):
    assert leftover_tmp(study) == []
    assert {"study.json", "report.md"} <= files_under(study)


def test_report_into_a_read_only_study_is_one_line(study, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    folder = copy_study(study, tmp_path / "study")
    folder.chmod(0o555)
    try:
        r = quantstudy("report", str(folder), cwd=tmp_path)
    finally:
        folder.chmod(0o755)
    assert_one_line_error(r, str(Path(folder)))


def _tensors(value: object) -> bool:
    """A cache entry's content: a tensor, or (a held-out chunk's rows) a dict of tensors."""
    if isinstance(value, dict):
        return bool(value) and all(isinstance(t, torch.Tensor) for t in value.values())
    return isinstance(value, torch.Tensor)
