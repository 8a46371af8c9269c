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

from pydantic import ValidationError

from quantstudy.record import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_text_atomic
from quantstudy.record.readers import read_json
from quantstudy.record.study import MODIFIED, check_seal, unsealed
from quantstudy.report.markdown import render_markdown
from quantstudy.report.meaning import check_meaning
from quantstudy.report.plots import PLOT_FILES, write_plots
from quantstudy.report.selfcheck import check_markdown

RECORD_FILE = "study.json"
REPORT_FILE = "report.md"


class ReportCheckError(RuntimeError):
    """The rendered Markdown failed its self-check: a renderer bug, not a user mistake."""


def load_record(path: Path) -> StudyRecord:
    """Read and validate a study record; a missing or invalid file is a `UserError`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"no study record at {path}: pass the folder a `quantstudy run` wrote "
            f"(it holds {RECORD_FILE})"
        )
    data = read_json(path, "study record", "record")
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a study record (a JSON object)")
    version = data.get("schema_version", SCHEMA_VERSION)
    known = range(OLDEST_SCHEMA_VERSION, SCHEMA_VERSION + 1)
    if isinstance(version, bool) or not isinstance(version, int) or version not in known:
        raise UserError(
            f"{path} has schema_version {version!r}; this quantstudy reads versions "
            f"{OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION}"
        )
    try:
        record = StudyRecord.model_validate(data)
    except ValidationError as e:
        first = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
        )
        more = f" (and {e.error_count() - 5} more)" if e.error_count() > 5 else ""
        raise UserError(f"{path} is not a valid study record: {first}{more}") from None
    check_seal(path, data)
    return record


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
