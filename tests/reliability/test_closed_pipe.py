"""Class 5: a reader that goes away (`quantstudy run ... | head -1`) ends the output, never the
work: the command goes on to its end, writes everything it would have written, and exits 141,
as a shell reports a writer SIGPIPE ended; no traceback, nothing lost."""

from __future__ import annotations

import json

import pytest

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
    assert "Traceback" not in r.err and "Exception ignored" not in r.err, r.err[-3000:]
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
