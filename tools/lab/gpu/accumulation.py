"""What fast accumulation costs in quality: one study per accumulation, side by side.

The engines sum their FP8 products all of K in the tensor cores by default ("fast", as torchao
does) or promote them to float32 every 128 products ("promote128", as cuBLASLt does without
fast accumulation; `record/build_spec.py`). This runs the same study (EfficientNet-Lite0 with
its real weights by default: random weights leave many logits near ties, which says little
about the kernels) with each `--fp8-accumulate` of --accumulate named on its command line,
each in a folder of its own under --work (a finished study is kept,
so a stopped command goes on where it was), and writes one JSON of the figures that answer the
question: the FP8 engine against fp32 (agreement, KL, top-1), against its own emulation beside
the emulation's floor, the decision, and x per batch.

Run from the repository root with quantstudy importable, e.g. on the device:
  python3 tools/lab/gpu/accumulation.py --data D/val-1300 --calib-data D/calib-500 \
      --class-list D/classes.txt --out $OUT/accumulation-lite0.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from study_run import run_cuda_study


def run_study(args: argparse.Namespace, accumulate: str) -> tuple[Path, dict[str, Any]]:
    """The study under one accumulation, run unless its folder holds a finished one."""
    out = args.work / f"accumulate-{accumulate}"
    if (out / "study.json").is_file():
        return out, {"fp8_accumulate": accumulate, "kept": True}
    extra = ("--fp8-accumulate", accumulate)
    info = run_cuda_study(args, args.model, args.weights, args.recipe, out, args.batches, extra)
    return out, info | {"fp8_accumulate": accumulate}


def _picked(section: object, names: dict[str, str]) -> dict[str, Any] | None:
    """`section`'s fields `names` (record name -> name in this file); None for no section."""
    if section is None:
        return None
    return {ours: getattr(section, theirs) for theirs, ours in names.items()}


def figures(study: Path) -> dict[str, Any]:
    """The figures of one study.json that the comparison reads."""
    from quantstudy.record import StudyRecord

    record = StudyRecord.model_validate_json((study / "study.json").read_text())
    quality, speed = record.quality, record.speed
    fp8 = next((e for e in quality.engines if e.engine == "fp8"), None) if quality else None
    env = ("gpu_name", "gpu_driver", "torch", "cuda", "git_commit")
    return {
        "fp8_accumulate": record.config.fp8_accumulate,
        "lab_switches": record.environment.lab_switches,
        "environment": _picked(record.environment, {k: k for k in env}),
        "fp8_vs_fp32": _picked(
            fp8,
            {
                "agreement": "agreement",
                "differ_count": "differ",
                "n_images": "n_images",
                "kl_mean": "kl_mean",
                "top1": "top1",
                "top1_reference": "top1_fp32",
            },
        ),
        "fp8_vs_emulation": _picked(
            quality.emulation_gap if quality else None,
            {
                "differ_count": "differ",
                "kl_mean": "kl_mean",
                "floor_differ_count": "floor_differ",
                "floor_kl_mean": "floor_kl_mean",
            },
        ),
        "decision": None if record.decision is None else str(record.decision.outcome),
        "x": {b.batch: b.ratio.median for b in speed.batches} if speed else {},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tf_efficientnet_lite0")
    p.add_argument("--weights", default="efficientnet-lite0")
    p.add_argument("--recipe", default="generic_pointwise")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--calib-data", type=Path)
    p.add_argument("--class-list", type=Path)
    p.add_argument("--calib", type=int, default=500)
    p.add_argument("--heldout", type=int, default=1300)
    p.add_argument("--batches", default="1,128")
    p.add_argument("--accumulate", default="promote128,fast", help="the accumulations, in order")
    p.add_argument("--work", type=Path, default=Path("/tmp/accumulation"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs: list[dict[str, Any]] = []
    for accumulate in args.accumulate.split(","):
        study, info = run_study(args, accumulate)
        runs.append(info | figures(study))
        args.out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")  # each as it ends
        print(json.dumps(runs[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
