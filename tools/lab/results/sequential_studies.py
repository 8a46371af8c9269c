"""The looks of `--heldout auto` studies (and their `extend`), as a small results JSON and a table.

    PYTHONPATH=src python tools/lab/results/sequential_studies.py STUDY_DIR [STUDY_DIR ...] \
        --out docs/results/sequential/<file>.json

For each study folder: its model, recipe, images, and per quality gate the estimate, the
confidence sequence's interval and the status at the last look of the first run (the held-out
folder's images) and at the last look after each `extend`, with the images at which a gate
settled. The numbers are read from the sealed study.json (checked by `load_record`), never
typed; the provenance is the record's own (commit, versions, machine) plus this command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantstudy.record import StudyRecord
from quantstudy.record.io import write_json_atomic
from quantstudy.record.load import RECORD_FILE, load_record


def _gates(look: Any) -> list[dict[str, Any]]:
    return [
        {
            "gate": g.name,
            "images": g.images,
            "estimate": g.estimate,
            "lower": g.lower,
            "upper": g.upper,
            "threshold": g.threshold,
            "status": str(g.status),
            "settled_at": g.settled_at,
        }
        for g in look.gates
    ]


def summarize(record: StudyRecord) -> dict[str, Any]:
    """The looks that end each stage of a sequential study: the first run, then each extend."""
    seq = record.sequential
    if seq is None:
        raise SystemExit(f"{record.name}: not a --heldout auto study (no sequential section)")
    first = record.data.heldout.n_images
    ends = [first]
    for added in record.data.extended:
        ends.append(ends[-1] + added.n_images)
    looks = {look.images: look for look in seq.looks}
    stages = []
    for i, images in enumerate(ends):
        folder = record.data.heldout.folder if i == 0 else record.data.extended[i - 1].folder
        stages.append(
            {
                "stage": "run" if i == 0 else f"extend {i}",
                "folder": folder,
                "images": images,
                "gates": _gates(looks[images]),
            }
        )
    env = record.environment
    return {
        "study": record.name,
        "digest": record.digest,
        "model": record.config.model,
        "recipe": record.recipe.name,
        "calibration_images": record.data.calibration.n_images,
        "method": seq.method,
        "confidence": seq.confidence,
        "round_size": seq.round_size,
        "stop_reason": str(seq.stop_reason),
        "outcome": None if record.decision is None else str(record.decision.outcome),
        "stages": stages,
        "config": record.config.model_dump(mode="json", exclude={"out"}),
        "extended_with": [s.folder for s in record.data.extended],
        "provenance": env.model_dump(mode="json"),
    }


def table(summary: dict[str, Any]) -> list[str]:
    lines = [f"{summary['model']} / {summary['recipe']} ({summary['calibration_images']} calib)"]
    for stage in summary["stages"]:
        for g in stage["gates"]:
            low, high = g["lower"], g["upper"]
            interval = "-" if low is None else f"[{low:.4g}, {high:.4g}]"
            lines.append(
                f"  {stage['stage']:<9} {stage['images']:>5} {g['gate']:<28} {g['status']:<12} "
                f"{interval:<22} settled at {g['settled_at']}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    summaries = [summarize(load_record(Path(d) / RECORD_FILE)) for d in args.studies]
    for s in summaries:
        print("\n".join(table(s)))
    command = " ".join(
        ["PYTHONPATH=src python tools/lab/results/sequential_studies.py", *sys.argv[1:]]
    )
    write_json_atomic(args.out, {"command": command, "studies": summaries})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
