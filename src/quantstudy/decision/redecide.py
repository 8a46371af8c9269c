"""Take a study's decision again, from its recorded measurements, under a (new) policy.

The measurements are not re-run: gates whose numbers the record does not hold (a KL interval, or
FP8 scored against fp16, in studies before schema 6) are inconclusive and say so. The new
decision carries `redecided` (the study's own outcome and policy, the version that decided), so
the report states that the decision was taken later. The study's own decision is the one `run`
took: a decision taken again carries it on, so any number of re-decisions never lose it. Only
the `decision` key of study.json is rewritten; every measured value stays as the study wrote it,
with its schema version.
"""

from __future__ import annotations

from pathlib import Path

from quantstudy.decision.policy import decide, load_policy
from quantstudy.record import SCHEMA_VERSION, Decision, Redecision, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.record.load import RECORD_FILE, load_record_data
from quantstudy.record.version import __version__


def redecide(record: StudyRecord, policy_name: str | Path | None) -> Decision:
    """The decision of `record` under `policy_name`, marked as taken again."""
    policy, label = load_policy(policy_name)
    previous = record.decision
    decision = decide(record, policy, label)
    if previous is not None and previous.redecided is not None:  # taken again before
        own = (previous.redecided.previous_outcome, previous.redecided.previous_policy)
    else:
        own = (previous.outcome, previous.policy) if previous is not None else (None, None)
    again = Redecision(
        previous_outcome=own[0],
        previous_policy=own[1],
        tool_version=__version__,
        schema_version=SCHEMA_VERSION,
    )
    return decision.model_copy(update={"redecided": again})


def redecide_file(study_dir: Path, policy_name: str | Path | None) -> StudyRecord:
    """Rewrite the decision in `study_dir/study.json`; return the updated record."""
    path = Path(study_dir) / RECORD_FILE
    if not path.is_file():
        raise UserError(f"no study.json in {study_dir}: give a folder that `quantstudy run` wrote")
    record, raw = load_record_data(path, "decide")
    decision = redecide(record, policy_name)
    raw["decision"] = decision.model_dump(mode="json")
    write_json_atomic(path, raw)
    return StudyRecord.model_validate(raw)
