"""The zoo's rows kept in the repository (`docs/results/zoo/`, one JSON per model): a run keeps
each fresh one and measures only the rows that are missing or stale, so device calls add up.

A row is fresh when it answers (complete, or no layer for FP8) and was measured with what the
current run would use: the same engine sources (`study/sources.py`: what the code computes, so a
docstring or comment edit keeps a row; a row hashed by bytes, before that, is stale), the same
study settings (`zoo/points.py: row_settings`), and the same GPU, torch and Triton.
`stale_reasons` says what differs; a failed, interrupted or pending row is always measured
again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.record.readers import not_a_file, read_json
from quantstudy.study.sources import HASHED_BY
from quantstudy.zoo.board import ZooRow, is_answer

# A row measured under others is stale (lab_switches: a tuning bound or another accumulation
# makes other engines, `env/switches.py`).
ROW_ENVIRONMENT = ("gpu_name", "torch", "triton", "lab_switches")


@dataclass(frozen=True)
class Current:
    """What this run would measure a row with."""

    engine_sources: str
    environment: dict[str, str | None]  # `ROW_ENVIRONMENT` of this host


def row_file(rows: Path, model: str) -> Path:
    return rows / (re.sub(r"[^A-Za-z0-9_.-]", "_", model) + ".json")


def read_rows(rows: Path, *, required: bool = False) -> dict[str, ZooRow]:
    """Every row in the folder `rows`, by model. A file that is not a row, and two files that
    hold one model's row (which to show would be a guess), are a `UserError` naming them; so is
    a `rows` that is not a folder. A missing folder has no rows (a run creates it), unless
    `required` (the page drawn from it alone would list every model pending: a typo would
    blank it), which refuses it, and a folder without a row, in one line."""
    kind = not_a_file(rows)
    if kind == "missing" and not required:
        return {}
    if kind != "a folder":
        what = "does not exist" if kind == "missing" else f"is {kind or 'a file'}"
        raise UserError(
            f"--rows {rows} {what}; give the folder of committed rows (one JSON per model)"
        )
    found: dict[str, ZooRow] = {}
    where: dict[str, Path] = {}
    for path in sorted(rows.glob("*.json")):
        try:
            row = ZooRow.model_validate(read_json(path, "zoo row", "record"))
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise UserError(f"{path} is not a zoo row ({loc}: {first['msg']})") from None
        if row.model in where:
            raise UserError(
                f"{where[row.model]} and {path} both hold the row of {row.model}; keep the one "
                f"named {row_file(rows, row.model).name} and remove the other"
            )
        found[row.model], where[row.model] = row, path
    if required and not found:
        raise UserError(f"--rows {rows} holds no zoo row (*.json); give the committed rows folder")
    return found


def write_row(rows: Path, row: ZooRow) -> Path:
    rows.mkdir(parents=True, exist_ok=True)
    path = row_file(rows, row.model)
    write_json_atomic(path, row.model_dump(mode="json", exclude_defaults=True))
    return path


def stale_reasons(row: ZooRow, settings: dict[str, Any], current: Current) -> list[str]:
    """Why `row` must be measured again for `settings` under `current`; empty: keep it."""
    if not is_answer(row):
        return [f"status {row.status}"]
    m = row.measured
    if m is None:
        return ["no record of where it was measured"]
    reasons = []
    if m.sources_hashed != HASHED_BY:
        then = (m.engine_sources or "not recorded")[:12]
        reasons.append(
            f"engine sources hashed by {m.sources_hashed} ({then} measured), before the hash "
            f"of what they compute (`study/sources.py`)"
        )
    elif m.engine_sources != current.engine_sources:
        then = (m.engine_sources or "not recorded")[:12]
        reasons.append(f"engine sources changed ({then} measured)")
    if m.settings != settings:
        changed = sorted(
            k for k in settings.keys() | m.settings.keys() if settings.get(k) != m.settings.get(k)
        )
        reasons.append("settings changed: " + ", ".join(changed))
    for key in ROW_ENVIRONMENT:
        if m.environment.get(key) != current.environment.get(key):
            reasons.append(
                f"{key} {m.environment.get(key)} measured, {current.environment.get(key)} here"
            )
    return reasons
