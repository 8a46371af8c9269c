"""Render a `StudyRecord` as the study's Markdown section, in the seeds' structure.

`render_markdown(record)` is a pure function of the record: same record, same bytes. It reads
nothing else (no clock, no files), so `quantstudy report STUDY_DIR` can re-render at any time.

Every number printed is a value of the record passed through one of the formatters of
`report/format.py` (`FORMATTERS`); `report/selfcheck.py` applies the same
formatters to every numeric leaf of the record to verify that each number in the Markdown comes
from it. So: no arithmetic on record values in the sections (no differences, ratios or sums
printed), and no number typed into the prose. Strings of the record (gate thresholds, warnings,
versions, names) are printed verbatim.

Each section lives in `report/sections/`; this module only puts them in order.
"""

from __future__ import annotations

import re

from quantstudy.record import StudyRecord
from quantstudy.report.sections.closing import (
    render_not_tried,
    render_other_formats,
    render_revisit,
    render_warnings,
)
from quantstudy.report.sections.method import render_method
from quantstudy.report.sections.recipe import render_recipe
from quantstudy.report.sections.results import render_results
from quantstudy.report.sections.summary import render_summary, render_title

__all__ = ["render_markdown"]


def render_markdown(record: StudyRecord) -> str:
    """The study's Markdown section; deterministic, every number from `record`."""
    r = record
    lines = [
        *render_title(r),
        *render_summary(r),
        *render_recipe(r),
        *render_method(r),
        *render_results(r),
        *render_warnings(r),
        *render_other_formats(r),
        *render_not_tried(r),
        *render_revisit(r),
    ]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"
