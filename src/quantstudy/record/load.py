"""The one reader of a study record (`study.json`).

Every command that reads a record goes through `load_record_data`: `report`, `decide`, `export`,
`extend`, `package`, `import-trt`, a sweep's rows and finished points, and `run` when its
folder already holds a record. So each refuses, in the same line, what none of them can read:
a missing file, a file that is not a JSON object, a schema version this quantstudy does not
know (a record written by a newer quantstudy holds sections the older one would misread or
reject field by field), a record that does not validate, and a sealed record whose digest no
longer matches (`record/study.check_seal`). A pydantic error never reaches the user as a
traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantstudy.record.base import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION
from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_json
from quantstudy.record.study import StudyRecord, check_seal

RECORD_FILE = "study.json"


def schema_problem(path: Path, data: dict[str, Any]) -> str | None:
    """Why this quantstudy cannot read the record `data` of `path` by its schema version, or
    None. A record without a version is read as the current one."""
    version = data.get("schema_version", SCHEMA_VERSION)
    known = range(OLDEST_SCHEMA_VERSION, SCHEMA_VERSION + 1)
    if isinstance(version, bool) or not isinstance(version, int) or version not in known:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = " (written by a newer quantstudy: upgrade quantstudy to read it)" if newer else ""
        return (
            f"{path} has schema_version {version!r}; this quantstudy reads versions "
            f"{OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION}{hint}"
        )
    return None


def load_record_data(
    path: Path | str, command: str | None = None
) -> tuple[StudyRecord, dict[str, Any]]:
    """The validated record at `path` and the JSON object it was read from (a command that
    rewrites one key writes the rest back as it was). `command`: a command that acts on the
    numbers (`decide`, `export`), which refuses an unsealed record (`check_seal`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"no study record at {path}: pass the folder a `quantstudy run` wrote "
            f"(it holds {RECORD_FILE})"
        )
    data = read_json(path, "study record", "record")
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a study record (a JSON object)")
    problem = schema_problem(path, data)
    if problem is not None:
        raise UserError(problem)
    try:
        record = StudyRecord.model_validate(data)
    except ValidationError as e:
        first = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
        )
        more = f" (and {e.error_count() - 5} more)" if e.error_count() > 5 else ""
        raise UserError(f"{path} is not a valid study record: {first}{more}") from None
    check_seal(path, data, command)
    return record, data


def load_record(path: Path | str, command: str | None = None) -> StudyRecord:
    """The validated record at `path` (`load_record_data`)."""
    return load_record_data(path, command)[0]
