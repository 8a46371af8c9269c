"""A study's build seconds and where its tiles came from, from its study.json, as one JSON line
per study: for the `table-seconds` job (`tools/device/jobs/records.yaml`), which builds one
model's engines cold, with the shipped tuning table and warm.

  python3 tools/device/build_seconds.py NAME=STUDY_FOLDER ... > table-seconds.json

build_s is the zoo row's (`zoo/board.py: is_build`: every engine build and compile stage);
tune_s the Triton tile tuning inside them (compile and timing of configs); choices the
launches whose tile came from the table, the machine's store or tuning (`StageTime.choices`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quantstudy.record.errors import UserError
from quantstudy.record.load import load_record
from quantstudy.record.timings import TileChoices
from quantstudy.zoo.board import is_build


def summary(folder: Path) -> dict[str, object]:
    record = load_record(folder / "study.json")
    stages = record.timings.stages if record.timings is not None else []
    built = [s for s in stages if is_build(s.stage)]
    tuned = [s.tuning for s in built if s.tuning is not None]
    chosen = sum(
        (s.choices for s in stages if s.choices is not None), TileChoices(table=0, store=0, tuned=0)
    )
    return {
        "status": record.status,
        "build_s": round(sum(s.seconds for s in built), 1),
        "tune_s": round(sum(t.compile_s + t.timing_s for t in tuned), 1),
        "total_s": record.timings.total_s if record.timings is not None else None,
        "choices": chosen.model_dump(),
        "gpu": record.environment.gpu_name,
        "git_commit": record.environment.git_commit,
    }


def main(argv: list[str]) -> int:
    for arg in argv:
        name, _, folder = arg.partition("=")
        try:
            found = summary(Path(folder))
        except UserError as err:  # a study that did not finish: its line says so, the others go on
            found = {"error": str(err)}
        print(json.dumps({"run": name, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
