"""One study's wall time per stage, from cold caches and warm (a lab tool for the GPU machine).

    python tools/lab/bench/study_time.py tf_efficientnet_lite0 --out DIR --record FILE.json -- \\
        --weights efficientnet-lite0 --data VAL --calib-data CALIB --calib 300 --heldout 1000

Runs `quantstudy run MODEL ARGS` twice, each in its own process, with the host caches a sweep
gives its studies (Inductor, Triton, the FP8 tuning choices, calibration statistics) in a fresh
folder: the first run finds them empty (cold), the second finds what the first left (warm).
Prints the stage table of both (`StudyRecord.timings`), the process wall times, what the FP8
autotuners cost in each (the FP8 product, kxk and depthwise convs together, per kernel in the
record; `quant/kernels/tuning.py: TUNE_LOG`), and whether the two studies measured
the same quality (every engine's figures must be equal; speed differs by timing noise).
Writes the figures with provenance (command, commit, GPU, driver, versions) to `--record`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantstudy.bench.study_time import stage_table
from quantstudy.quant.kernels.tuning import summary
from quantstudy.record.io import write_json_atomic
from quantstudy.record.load import RECORD_FILE, load_record_data
from quantstudy.sweep.caches import caches_under

PROGRAM = "python tools/lab/bench/study_time.py"
PHASES = ("cold", "warm")


def parse_with_run_args(
    p: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, list[str]]:
    """The tool's own options (before `--`) and the `quantstudy run` options after it."""
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    return p.parse_args(argv[:cut]), argv[cut + 1 :]


def _env(cache: Path, tune_log: Path) -> dict[str, str]:
    """This process's environment with the host caches of `sweep/caches.py` all under `cache`."""
    env = {**os.environ, **caches_under(cache), "PYTHONUNBUFFERED": "1"}
    env["QUANTSTUDY_TUNE_LOG"] = str(tune_log)
    return env


def _run(model: str, args: list[str], out: Path, env: dict[str, str], log: Path) -> dict:
    command = [sys.executable, "-c", "from quantstudy.cli import main; main()", "run", model]
    command += [*args, "--out", str(out), "--force"]
    start = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    studies = sorted(out.rglob(RECORD_FILE))
    record = load_record_data(studies[0])[1] if studies else None
    return {"rc": rc, "wall_s": round(wall, 2), "record": record, "log": str(log)}


def _tuning(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {
        "per_kernel": summary(rows),
        "tuned_launches": len(rows),
        "configs_timed": sum(r["configs"] for r in rows),
        "compile_s": round(sum(r["compile_s"] for r in rows), 2),
        "tune_s": round(sum(r["tune_s"] for r in rows), 2),
        "rows": rows,
    }


def _quality(record: dict | None) -> object:
    """The quality section without anything that is allowed to differ between runs."""
    return None if record is None else record.get("quality")  # None: no study to compare


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="tools/lab/bench/study_time.py", description=__doc__)
    p.add_argument("model", help="timm name")
    p.add_argument("--out", type=Path, required=True, help="folder for the studies and logs")
    p.add_argument("--record", type=Path, required=True, help="JSON record to write")
    p.add_argument("--cache", type=Path, help="cache folder (default: a fresh one under --out)")
    p.add_argument("--phases", default="cold,warm", help="cold,warm (default) or one of them")
    p.epilog = "after --: the `quantstudy run` options of the study"
    a, run_args = parse_with_run_args(p, argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cache = a.cache or Path(tempfile.mkdtemp(prefix="cache-", dir=a.out))
    phases: dict[str, dict] = {}
    for phase in a.phases.split(","):
        if phase not in PHASES:
            raise SystemExit(f"--phases takes cold and/or warm, not {phase!r}")
        tune_log = a.out / f"{phase}-tuning.jsonl"
        tune_log.unlink(missing_ok=True)
        env = _env(cache, tune_log)
        result = _run(a.model, run_args, a.out / phase, env, a.out / f"{phase}.log")
        result["tuning"] = _tuning(tune_log)
        phases[phase] = result
        print(f"{phase}: exit {result['rc']}, {result['wall_s']:.1f} s", flush=True)
        _write(a, run_args, phases)
    print(stage_table(phases), flush=True)
    if len(phases) == 2:
        same = _quality(phases["cold"]["record"]) == _quality(phases["warm"]["record"])
        print(f"quality section identical cold and warm: {same}", flush=True)


def _write(a: argparse.Namespace, run_args: list[str], phases: dict[str, dict]) -> None:
    import torch

    from quantstudy.bench.provenance import collect_provenance

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    argv = [a.model, "--out", str(a.out), "--record", str(a.record)]
    summary = {}
    for phase, r in phases.items():
        rec = r["record"] or {}
        summary[phase] = {
            "rc": r["rc"],
            "wall_s": r["wall_s"],
            "timings": rec.get("timings"),
            "tuning": r["tuning"],
            "decision": (rec.get("decision") or {}).get("outcome"),
            "quality": rec.get("quality"),
            "speed": rec.get("speed"),
        }
    same = None
    if "cold" in phases and "warm" in phases:
        same = _quality(phases["cold"]["record"]) == _quality(phases["warm"]["record"])
    doc = {
        "kind": "study-time",
        "provenance": collect_provenance(
            device, [*argv, "--", *run_args], program=PROGRAM
        ).model_dump(),
        "run_args": run_args,
        "phases": summary,
        "quality_identical": same,
        "table": stage_table(phases),
    }
    a.record.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(a.record, doc)


if __name__ == "__main__":
    main()
