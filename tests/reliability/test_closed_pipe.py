"""Class 5: a reader that goes away (`quantstudy run ... | head -1`) ends the output, never the
work: the command goes on to its end, writes everything it would have written, and exits 141,
as a shell reports a writer SIGPIPE ended; no traceback, nothing lost.

Where stderr goes into the closed pipe too (`2>&1 | head -1`) no traceback could be read there:
exit status 141 is what says none ended the command (a bug exits 5 with its crash log, an
exception at exit 1, a failed final flush 120), and no crash log is written."""

from __future__ import annotations

import json

import pytest

from quantstudy.cli_crash import LOG_PREFIX
from tests.reliability._drive import (
    copy_study,
    leftover_tmp,
    measured,
    quantstudy,
    quantstudy_into_closed_pipe,
    study_args,
)

EXIT_PIPE = 141


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_study_whose_reader_went_away_completes(workspace, study, tmp_path, stderr_too):
    out = tmp_path / "study"
    r = quantstudy_into_closed_pipe(*study_args(out), cwd=workspace, stderr_too=stderr_too)
    assert r.code == EXIT_PIPE, r.err[-3000:]
    if not stderr_too:  # else stderr went into the closed pipe: nothing to read (docstring)
        assert r.err and "Traceback" not in r.err and "Exception ignored" not in r.err, r.err
    assert not list(out.glob(f"{LOG_PREFIX}*")) and not list(workspace.glob(f"{LOG_PREFIX}*"))
    assert json.loads((out / "study.json").read_text())["status"] == "complete"
    assert measured(out) == measured(study)  # the same study, number for number
    assert (out / "report.md").is_file() and leftover_tmp(out) == []


@pytest.mark.parametrize(
    "argv",
    [
        ("decide", "{study}", "--policy", "strict"),
        ("report", "{study}"),
        ("recipes", "show", "generic_pointwise", "--model", "test_efficientnet", "--json"),
        ("recipes",),
    ],
    ids=["decide", "report", "recipes-show-json", "recipes"],
)
def test_other_commands_end_their_work_and_exit_141(study, tmp_path, argv):
    folder = copy_study(study, tmp_path / "study")
    r = quantstudy_into_closed_pipe(*(a.format(study=folder) for a in argv), cwd=tmp_path)
    assert r.code == EXIT_PIPE and r.err == "", r.err[-3000:]
    if argv[0] == "decide":  # the decision was taken again and written, the record still sealed
        decision = json.loads((folder / "study.json").read_text())["decision"]
        assert decision["policy"] == "builtin:strict"
        assert quantstudy("report", str(folder), cwd=tmp_path).code == 0
    if argv[0] in ("decide", "report"):
        assert leftover_tmp(folder) == []
