"""Re-render a study's report from its `study.json`: `quantstudy report STUDY_DIR`.

`render_study(study_dir)` loads `study_dir/study.json` as a `StudyRecord`, renders the Markdown,
runs the self-check (`report/selfcheck.py`), and writes `report.md` and the PNG plots beside
the record, each atomically. It reads nothing but the record, so rendering twice gives the same
bytes. A report that fails its self-check is not written: that is a bug in the renderer.

Before rendering, the record must show it is intact: its digest (`record/study.py`) must match
its sealed sections, and its decision must follow from its gates and its policy
(`report/meaning.py`). A record edited after the study is refused with one line, so no report
that contradicts itself is published.
"""

from __future__ import annotations

from pathlib import Path

from quantstudy.record.errors import UserError
from quantstudy.record.io import write_text_atomic
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.study import MODIFIED, unsealed
from quantstudy.report.markdown import render_markdown
from quantstudy.report.meaning import check_meaning
from quantstudy.report.plots import PLOT_FILES, write_plots
from quantstudy.report.selfcheck import check_markdown

REPORT_FILE = "report.md"


class ReportCheckError(RuntimeError):
    """The rendered Markdown failed its self-check: a renderer bug, not a user mistake."""


def render_study(study_dir: Path) -> Path:
    """(Re)render `report.md` and the plots from `study_dir/study.json`; return the report path."""
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise UserError(f"study folder not found: {study_dir}")
    record = load_record(study_dir / RECORD_FILE)
    disagreements = check_meaning(record)
    if disagreements:
        raise UserError(
            f"{study_dir / RECORD_FILE} does not agree with itself: {disagreements[0]}"
            f"{f' (and {len(disagreements) - 1} more)' if len(disagreements) > 1 else ''}; "
            + (
                f"{MODIFIED}, or decided by another version: take the decision again with "
                f"`quantstudy decide {study_dir}`"
                if not unsealed(record)  # sealed numbers: only the decision is in question
                else f"{MODIFIED} and unsealed: rerun the study to get a record to trust"
            )
        )
    md = render_markdown(record)
    problems = check_markdown(md, record)
    if problems:
        raise ReportCheckError(
            "rendered report failed its self-check:\n  " + "\n  ".join(problems[:20])
        )
    written = {p.name for p in write_plots(record, study_dir)}
    for name in PLOT_FILES:  # a plot whose data is gone must not linger beside the report
        if name not in written:
            (study_dir / name).unlink(missing_ok=True)
    out = study_dir / REPORT_FILE
    write_text_atomic(out, md)
    return out
