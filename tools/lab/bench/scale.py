"""One study at several held-out sizes, wall per stage and peak memory (a lab tool).

    python tools/lab/bench/scale.py test_efficientnet --sizes 1000,10000 --out DIR \\
        --record FILE.json -- --weights random --device cpu --data VARIANTS --calib 64 --no-speed

Runs `quantstudy run MODEL ARGS --heldout N` once per size, each in its own process, and reads
back the process's peak resident memory (`os.wait4`: the largest of the study's process and
of its decode workers), its wall time, and the study's stage table (`StudyRecord.timings`).
Prints one table (stage x size) and writes it with provenance to `--record`: whether memory
grows with the number of held-out images is the difference between the columns. The held-out
images are meant to come from `tools/lab/make_variants.py`: crops and flips of one photo measure
throughput, not quality.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# this folder's: a script's own folder is on its path
from study_time import parse_with_run_args

from quantstudy.record.io import write_json_atomic
from quantstudy.record.load import RECORD_FILE, load_record_data
from quantstudy.sweep.caches import CACHE_FOLDERS

HELDOUT_STAGE = "held-out: "


def _run(
    model: str, size: int, args: list[str], out: Path, threads: int, cold: bool = False
) -> dict:
    """One study in its own process; its wall time and peak resident memory (`os.wait4`:
    the largest of the study's process and the decode workers it waited for)."""
    folder, log = out / f"heldout-{size}", out / f"{size}.log"
    code = "from quantstudy.cli import main; main()"
    if threads:
        code = f"import torch; torch.set_num_threads({threads}); " + code
    command = [sys.executable, "-c", code, "run", model, *args]
    command += ["--heldout", str(size), "--out", str(folder), "--force"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if cold:  # the host caches a sweep gives its studies, empty: each size compiles from cold
        cache = Path(tempfile.mkdtemp(prefix=f"cache-{size}-", dir=out))
        env |= {var: str(cache / sub) for var, sub in CACHE_FOLDERS.items()}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = round(time.perf_counter() - start, 2)
    study = folder / RECORD_FILE
    record = load_record_data(study)[1] if study.is_file() else {}
    stages = {s["stage"]: s["seconds"] for s in (record.get("timings") or {}).get("stages", [])}
    heldout = (record.get("data") or {}).get("heldout") or {}
    n = heldout.get("n_images")
    passed = sum(v for k, v in stages.items() if k.startswith(HELDOUT_STAGE))
    return {
        "rc": proc.returncode,
        "wall_s": wall,
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "size": size,
        "heldout_images": n,
        "heldout_pass_s": round(passed, 2),
        "heldout_images_per_s": round(n / passed, 1) if n and passed else None,
        "stages": stages,
        "decision": (record.get("decision") or {}).get("outcome"),
        "log": str(log),
    }


def table(results: list[dict]) -> str:
    """Stage x size: seconds per stage, then the pass rate, wall and peak memory."""
    names: list[str] = []
    for r in results:
        names += [s for s in r["stages"] if s not in names]
    rows = [(n, [r["stages"].get(n) for r in results]) for n in names]
    rows += [
        ("held-out images/s", [r["heldout_images_per_s"] for r in results]),
        ("process wall, s", [r.get("wall_s") for r in results]),
        ("peak memory, MiB", [r.get("peak_rss_mib") for r in results]),
    ]
    width = max(len(n) for n, _ in rows)
    head = f"{'stage':<{width}}  " + "  ".join(f"{r['size']:>9}" for r in results)
    lines = [head]
    for name, values in rows:
        cells = [f"{'-' if v is None else f'{v:.1f}':>9}" for v in values]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="tools/lab/bench/scale.py", description=__doc__)
    p.add_argument("model", help="timm name")
    p.add_argument("--sizes", required=True, help="held-out sizes, comma-separated")
    p.add_argument("--out", type=Path, required=True, help="folder for the studies and logs")
    p.add_argument("--record", type=Path, required=True, help="JSON record to write")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--cold", action="store_true", help="empty compile caches for every size")
    p.epilog = "after --: the `quantstudy run` options of the study (not --heldout, --out)"
    a, run_args = parse_with_run_args(p, argv)
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes takes counts like 1000,10000, not {a.sizes!r}") from None
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for size in sizes:
        results.append(_run(a.model, size, run_args, a.out, a.threads, a.cold))
        r = results[-1]
        peak = r.get("peak_rss_mib")
        print(f"{size}: exit {r['rc']}, {r.get('wall_s')} s, {peak} MiB", flush=True)
        _write(a, argv, run_args, results)
    print(table(results), flush=True)


def _write(a: argparse.Namespace, argv: list[str], run_args: list[str], results: list) -> None:
    import torch

    from quantstudy.bench.provenance import collect_provenance

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peaks = [r.get("peak_rss_mib") for r in results if r.get("peak_rss_mib") is not None]
    doc = {
        "kind": "scale",
        "provenance": collect_provenance(
            device, argv, program="python tools/lab/bench/scale.py"
        ).model_dump(),
        "run_args": run_args,
        "threads": a.threads,
        "cold": a.cold,
        "results": results,
        "peak_rss_spread_mib": round(max(peaks) - min(peaks), 1) if peaks else None,
        "table": table(results),
    }
    a.record.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(a.record, doc)


if __name__ == "__main__":
    main()
