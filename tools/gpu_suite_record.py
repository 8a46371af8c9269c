"""The GPU suite's records (tools/gpu_suite.py runs the suite): a group's counts, failures and
skips read from pytest's JUnit XML, or from its -v log where it was stopped first; the machine a
part ran on; a part's record written whole and read back; the terminal's table.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS = ("tests", "passed", "failed", "errors", "skipped")
MACHINE = ("gpu", "gpus", "driver", "cpus", "platform", "versions", "commit")
PART_KEYS = ("part", "marks", *MACHINE, *COUNTS, "wall_s", "complete", "groups")


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


def read_junit(path: Path) -> dict:
    """Counts, failures with their first message line, and skips grouped by reason."""
    if not path.is_file():
        zero = dict.fromkeys(("tests", "passed", "failed", "errors", "skipped"), 0)
        return zero | {"failures": [], "skips": {}, "slowest": [], "note": "no JUnit XML"}
    cases = ET.parse(path).getroot().iter("testcase")
    failures, skips, counts, times = [], Counter(), Counter(), {}
    for case in cases:
        if case.get("name") is None:  # the test a Ctrl-C stopped: it did not end, so no count
            continue
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


def write_json(path: Path, record: dict) -> None:
    """Whole or not at all: a call that ends mid-write leaves the previous file or none."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


class MergeError(Exception):
    """Part records that cannot make one record; the message says which and why."""


def read_part(path: Path) -> dict:
    """A part's record as `run_part` wrote it; anything else is a `MergeError` naming `path`."""
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MergeError(f"{path}: {e}") from None
    absent = [k for k in PART_KEYS if k not in record] if isinstance(record, dict) else ["{}"]
    if absent:
        raise MergeError(f"{path} is not a part's record (it has no {', '.join(absent)})")
    return record


def part_summary(record: dict | None) -> dict:
    if record is None:
        return {}
    return {k: record[k] for k in ("wall_s", "complete", "gpu", "driver", *COUNTS)}
