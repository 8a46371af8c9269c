"""Benchmark `quantstudy package` on a GPU: a study, its packages, the check, as JSON.

For each model named (one after another, each record written as it ends, so a device command
stopped at its limit keeps the models it finished): run the study at batches 1 and 128
(`quantstudy run`, subprocess), package it (`package_study`, static batches 1 and 128), check
the packages in a process without quantstudy (`check_package`: agreement with the study's FP8
engine at its floor, NaN/Inf, packaged fp16 and FP8 timed with the study's harness method),
and write `$OUT/package-bench-<model>.json` with provenance (commit, GPU, driver, versions),
the study's x beside the packaged x per batch, load time, package sizes, compile time and the
tiles moved off the TMA path. Prints a short table.

Run from the repository root with quantstudy importable (PYTHONPATH=src), e.g.:
  python tools/lab/gpu/package_bench.py --model lite0 --data D/val-1300 \
      --calib-data D/calib-500 --class-list D/classes.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from study_run import run_cuda_study

from quantstudy.study.model_list import by_record_name, record_name

if TYPE_CHECKING:
    from quantstudy.study.model_list import ModelEntry

LIST = Path(__file__).with_name("package-models.yaml")  # a model list


@cache
def models() -> dict[str, ModelEntry]:
    """The list's models (`package-models.yaml`, read by the one model-list reader) by the name
    their records take (`record_name`: Lite0's records go by `lite0`)."""
    return by_record_name(LIST, "package bench list")


def _provenance() -> dict:
    import torch

    commit = os.environ.get("QUANTSTUDY_GIT_COMMIT")
    if commit is None and Path(".carry/COMMIT").is_file():
        commit = Path(".carry/COMMIT").read_text().strip()
    if commit is None:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = done.stdout.strip() or None
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except FileNotFoundError:  # no NVIDIA driver here
        smi = ""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "commit": commit,
        "gpu": smi or None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": sys.version.split()[0],
        "command": " ".join(sys.argv),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _study_ms(study: Path) -> dict[int, tuple[float, float]]:
    """The study's median fp16 and FP8 ms per batch (its speed section), to set beside the
    packages' own: the same harness method, so a gap in x says which engine it is in."""
    from quantstudy.record import StudyRecord

    speed = StudyRecord.model_validate_json((study / "study.json").read_text()).speed
    if speed is None:
        return {}
    return {b.batch: (b.fp16_ms.median, b.fp8_ms.median) for b in speed.batches}


def _study(args: argparse.Namespace, name: str, work: Path) -> tuple[Path, dict]:
    """The study, run once per work folder: a finished one (its `bench-study.json` beside
    study.json) is reused, so a second command on the same machine goes on where a first one
    was stopped."""
    entry = models()[name]
    out = work / f"study-{name}"
    done_file = work / f"bench-study-{name}.json"
    if done_file.is_file() and (out / "study.json").is_file():
        return out, json.loads(done_file.read_text()) | {"reused": True}
    info = run_cuda_study(args, entry.name, entry.weights or "random", entry.recipe, out)
    done_file.write_text(json.dumps(info))
    return out, info


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", type=record_name, choices=sorted(models()), required=True, nargs="+",
        help=f"models of {LIST.name}, by their records' name or their timm name",
    )  # fmt: skip
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--calib-data", type=Path)
    p.add_argument("--class-list", type=Path)
    p.add_argument("--calib", type=int, default=200)
    p.add_argument("--heldout", type=int, default=300)
    p.add_argument("--images", type=int, default=300, help="held-out images the check runs")
    p.add_argument("--work", type=Path, default=Path("/tmp/package-bench"))
    return p


def main() -> int:
    args = parser().parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    codes = []
    for name in args.model:
        try:
            codes.append(bench_one(args, name))
        except SystemExit as stop:  # a study that did not finish: say so, go on to the next
            print(f"{name}: {stop}", flush=True)
            codes.append(3)
    return max(codes)


def _progress(name: str, stage: str, seconds: float) -> None:
    print(f"{name}: {stage} in {seconds:.1f} s", flush=True)


def _packages(args: argparse.Namespace, name: str, study: Path) -> tuple[Path, float | None]:
    """The study's packages at batches 1 and 128 in the work folder (kept from an earlier
    command where its manifest is there), and the seconds packaging took (None: packaged by a
    command stopped before it wrote its time)."""
    from quantstudy.package.build import PackageOptions, package_study

    out = args.work / f"package-{name}"
    package_file = args.work / f"bench-package-{name}.json"
    kept = (out / "manifest.json").is_file()
    if not kept:
        start = time.perf_counter()
        options = PackageOptions(study, out, (1, 128), None, "cuda", args.data, args.calib_data)
        package_study(options)
        package_file.write_text(json.dumps({"package_s": round(time.perf_counter() - start, 1)}))
    package_s = None
    if package_file.is_file():
        package_s = json.loads(package_file.read_text())["package_s"]
    _progress(name, "packages (kept from an earlier command)" if kept else "packages",
              package_s or 0.0)  # fmt: skip
    return out, package_s


def _speed_rows(
    timing: dict, study_x: dict, study_ms: dict[int, tuple[float, float]]
) -> list[dict]:
    """Per packaged batch, the packaged x beside the study's, and both engines' medians."""
    from quantstudy.package.verify import X_TOLERANCE

    rows = []
    for batch, t in timing.items():
        theirs = study_x.get(batch)
        rows.append({
            "batch": int(batch), "study_x": theirs, "packaged_x": t["x"],
            # which engine moved, where the packaged x falls short: the study's medians
            "study_fp16_ms": study_ms.get(int(batch), (None, None))[0],
            "study_fp8_ms": study_ms.get(int(batch), (None, None))[1],
            "packaged_fp16_ms": t["fp16_ms"], "packaged_fp8_ms": t["fp8_ms"],
            "packaged_x_q1_q3": t["x_q1_q3"], "method": t["method"],
            "within_5pct_or_better": None if theirs is None
            else t["x"] >= theirs * (1 - X_TOLERANCE),
        })  # fmt: skip
    return rows


def bench_one(args: argparse.Namespace, name: str) -> int:
    """One model: study, packages, check, record; 0 when the check passed, 3 when not. Each
    stage done is kept in the work folder (and a partial record written to $OUT), so a
    command stopped at its limit loses only the stage it was in."""
    from quantstudy.package.verify import check_package

    target = Path(os.environ.get("OUT", ".")) / f"package-bench-{name}.json"
    study, study_info = _study(args, name, args.work)
    _progress(name, "study (kept from an earlier command)" if "reused" in study_info else "study",
              study_info["wall_s"])  # fmt: skip
    out, package_s = _packages(args, name, study)
    partial = {"provenance": _provenance(), "model": name, "study": study_info,
               "package_s": package_s, "check": "not finished"}  # fmt: skip
    target.write_text(json.dumps(partial, indent=1))
    start = time.perf_counter()
    checked = check_package(out, study, args.data, args.calib_data, args.images)
    check_s = round(time.perf_counter() - start, 1)
    _progress(name, "check", check_s)
    manifest = json.loads((out / "manifest.json").read_text())
    rows = _speed_rows(checked.timing, manifest["study"]["study_x"], _study_ms(study))
    record = {
        "provenance": _provenance(),
        "model": name,
        "study": study_info | {"dir": str(study), "name": manifest["study"]["name"]},
        "package_s": package_s,
        "compile_s": manifest["compile_s"],
        "check_s": check_s,
        "packages": [
            {k: e[k] for k in ("file", "engine", "batch", "bytes")} for e in manifest["packages"]
        ],
        "tiles": len(manifest["tiles"]),
        "tma_replaced": manifest["tma_replaced"],
        "fp8_ops": manifest["fp8_ops"],
        "speed": rows,
        "check": checked.to_json(),
    }
    target.write_text(json.dumps(record, indent=1))
    print(f"{name}: check {'passed' if checked else 'FAILED'}; agreement "
          f"{checked.agreement.agreement:.4f} ({checked.agreement.differ_count} of "
          f"{checked.n_images} differ), floor {checked.floor.differ_count}")  # fmt: skip
    for file, found in checked.per_package.items():
        print(f"  {file}: {found.differ_count} of {found.n_images} differ, KL mean "
              f"{found.kl_mean:.4g}")  # fmt: skip
    for batch, t in checked.timing.items():
        print(f"  batch {batch} timed by: {t.get('engines')}")
    print("batch  study x  packaged x  fp16 ms (study)  FP8 ms (study)")
    for r in rows:
        shown = f"{r['study_x']:.3f}" if r["study_x"] is not None else "-"
        ms16, ms8 = (f"{r[k]:.4f}" if r[k] else "-" for k in ("study_fp16_ms", "study_fp8_ms"))
        print(
            f"{r['batch']:>5}  {shown:>7}  {r['packaged_x']:>10.3f}  "
            f"{r['packaged_fp16_ms']:>7.4f} ({ms16})  {r['packaged_fp8_ms']:>6.4f} ({ms8})"
        )
    print(f"load s: {checked.load_s}; sizes: "
          f"{[(e['file'], e['bytes']) for e in manifest['packages']]}; TMA tiles moved to "
          f"pointers: {manifest['tma_replaced']} of {len(manifest['tiles'])}")  # fmt: skip
    print(f"wrote {target}")
    return 0 if checked else 3


if __name__ == "__main__":
    sys.exit(main())
