"""Preflight's machine checks and the filesystem message's choice of setting: cheap checks
that decide whether a study may start, and what a refusal tells the user to change."""

from __future__ import annotations

import errno

import pytest

from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.io import filesystem_message
from quantstudy.study.guard import check_batch_memory

GiB = 1 << 30


def _config(**kw) -> StudyConfig:
    return StudyConfig(model="m", data="d", **kw)


def test_a_batch_whose_input_alone_overfills_the_device_is_refused():
    # 4096 x 3x224x224 fp32 = 2.3 GiB: more than a quarter of 8 GiB
    with pytest.raises(UserError, match=r"--batches 4096: .*2\.3 GiB.*8 GiB.*at most 3\d\d\d"):
        check_batch_memory(_config(batches=(1, 4096)), (3, 224, 224), 8 * GiB)


def test_a_batch_that_fits_or_no_timing_passes():
    check_batch_memory(_config(batches=(1, 4096)), (3, 224, 224), 64 * GiB)
    check_batch_memory(_config(batches=(4096,), speed=False), (3, 224, 224), 1 * GiB)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("batches", (1, 4097), "do not fit one GPU"),
        ("seed", -1, r"generators take a seed in \[0, 2\*\*32\)"),
        ("calib", 10**9, "more than any image folder holds"),
    ],
)
def test_numeric_options_are_bounded_with_the_reason(field, value, needle):
    with pytest.raises(UserError, match=needle):
        _config(**{field: value})


def test_the_fix_names_the_cache_variable_below_which_the_fault_is(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSTUDY_CALIB_STATS_DIR", str(tmp_path / "stats"))
    error = OSError(errno.ENOTDIR, "Not a directory", str(tmp_path / "stats" / "a" / "b.pt"))
    line = filesystem_message(error)
    assert "set $QUANTSTUDY_CALIB_STATS_DIR to another folder" in line and "--out" not in line
    line = filesystem_message(OSError(errno.ENOENT, "No such file", str(tmp_path / "out")))
    assert "cannot be created" in line and line.endswith("give another --out")


def test_a_fault_in_a_study_folder_a_command_rewrites_names_no_out(tmp_path):
    """`report` and `decide` rewrite the study folder they are given and have no --out: a fault
    there says to copy the folder (`record/io.py: in_place`); elsewhere --out as before."""
    from quantstudy.record.io import IN_PLACE_FIX, in_place

    denied = OSError(errno.EACCES, "Permission denied", str(tmp_path / "study" / "report.md"))
    with in_place(tmp_path / "study"):
        line = filesystem_message(denied)
    assert line is not None and line.endswith(IN_PLACE_FIX) and "--out" not in line
    full = OSError(errno.ENOSPC, "No space left", str(tmp_path / "study" / "report.md"))
    with in_place(tmp_path / "study"):
        assert "--out" not in (filesystem_message(full) or "--out")
    assert (filesystem_message(denied) or "").endswith("give another --out you can write")
