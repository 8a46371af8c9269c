"""Run many GPU jobs in one device call, one job per GPU at a time, and pack what they wrote so
that it all comes back within the call's few files.

    python3 tools/device/batch.py JOBS.yaml --out "$OUT" [--budget 560] [--only NAME,...] [--gpus N]
    python3 tools/device/batch.py unpack FILE... --into DIR       # here, on the returned files

Why: device time is counted per machine held, not per GPU, and a call lasts at most 10 minutes;
a machine of 8 GPUs that runs one job uses an eighth of what it costs. The jobs file
(tools/device/jobs/records.yaml) lists each job's name, its shell command (`run`), its expected
`minutes`, the jobs it must wait for (`after`: it starts once they ended, however they ended,
and is not run if none of them ran) and the names to leave out of its pack (`skip`, e.g. a
study's `.cache`).

What starts: each job runs as `bash -c RUN` from the current folder, in its own process group,
with `CUDA_VISIBLE_DEVICES` one free GPU, `OUT` its own folder, `BATCH_JOB` its name,
`BATCH_JOBS` the folder holding every job's folder (an `after` job reads its predecessors'
output there), `TMPDIR` its own (so tools that install wheels or write under the temporary
folder do not replace each other's files mid-run) and `JOB_BUDGET_S` the whole seconds left
before the budget ends. With several GPUs the longest expected job goes first; on one GPU the
jobs run in the file's order, which is the priority. A job starts only if its expected minutes
fit in what is left of `--budget`; otherwise it is recorded as not run, with why. At the
budget's end every running job's group gets Ctrl-C, then SIGKILL `--grace` seconds later, and is
recorded as stopped, never as passed.

`batch.json` (in --out) is rewritten atomically at every start and end: each job's command,
GPU index and name, start, wall seconds, exit status, status (ok, failed, stopped, not_run) and
why, and `co_runners`, the jobs that ran on the host beside it (its timings shared the host's
CPUs with theirs); the commit (`.carry/COMMIT`), the host's GPUs and driver. At the end each
job's folder becomes one `NAME.tar.gz`, and these are bundled into at most 7 `jobs-K.tar` of at
most 16 MiB each, so batch.json and the bundles keep within the 8 files a call returns.

Only the standard library and PyYAML (which timm requires, so the GPU image has it).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from batch_jobs import JobsError, read_jobs, select
from batch_pack import pack, unpack
from batch_runner import RECORD, Batch, gpu_slots, host_gpus

EXIT_STATUS_BAD_INPUT = 2
EXIT_STATUS_INTERRUPTED = 130


def _host(gpus: list[dict[str, str]]) -> dict[str, object]:
    """What batch.json says of the host: the commit the tree was at, the GPUs and driver."""
    commit = Path(".carry/COMMIT")
    return {
        "commit": commit.read_text().strip() if commit.is_file() else None,
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "driver": gpus[0]["driver"] if gpus else None,
        "host_gpus": [{"index": g["index"], "name": g["name"]} for g in gpus],
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batch.py", description=__doc__.splitlines()[0])
    p.add_argument("jobs", type=Path, help="the jobs file (YAML list of name, run, minutes...)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT", "batch-out")),
        help="where batch.json and the bundles go (default $OUT)",
    )
    p.add_argument("--budget", type=float, default=560, help="seconds for the whole batch")
    p.add_argument("--only", help="run only these jobs (comma-separated names)")
    p.add_argument("--gpus", type=int, help="GPUs to use (default: every GPU nvidia-smi lists)")
    p.add_argument("--work", type=Path, help="the jobs' folders (default: a new temporary one)")
    p.add_argument("--grace", type=float, default=10, help="seconds from Ctrl-C to SIGKILL")
    return p


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main_run(argv: list[str]) -> int:
    opts = _parser().parse_args(argv)
    if opts.budget <= 0:
        raise JobsError(f"--budget {opts.budget:g}: give the seconds the batch may take")
    specs = select(read_jobs(opts.jobs), opts.only)
    found = host_gpus()
    slots = gpu_slots(found, opts.gpus)
    opts.out.mkdir(parents=True, exist_ok=True)
    work = opts.work or Path(tempfile.mkdtemp(prefix="quantstudy-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    if (work / "jobs").exists() and any((work / "jobs").iterdir()):
        raise JobsError(f"{work / 'jobs'} holds another batch's folders; give another --work")
    batch = Batch(specs, slots, opts.out, work.resolve(), opts.budget, opts.grace, _host(found))
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    batch.write()
    status = 0
    try:
        batch.run()
    except KeyboardInterrupt:
        batch.interrupt()
        status = EXIT_STATUS_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    batch.finished = status == 0
    batch.packed = pack(batch.jobs, batch.work, batch.out)
    batch.write()
    counts: dict[str, int] = {}
    for job in batch.jobs:
        counts[job.status] = counts.get(job.status, 0) + 1
    print(f"batch: {counts}; {', '.join(batch.packed) or 'nothing'} and {RECORD} in {opts.out}")
    return status or (0 if counts.get("ok", 0) == len(batch.jobs) else 1)


def main_unpack(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="batch.py unpack", description=unpack.__doc__)
    p.add_argument("files", nargs="+", type=Path, help="the call's jobs-K.tar (and batch.json)")
    p.add_argument("--into", type=Path, required=True, help="folder for the jobs' folders")
    opts = p.parse_args(argv)
    for target in unpack(opts.files, opts.into):
        print(target)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 every job ok, 1 one or more not, 2 a mistake in the input, 130 stopped."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return main_unpack(argv[1:]) if argv[:1] == ["unpack"] else main_run(argv)
    except JobsError as e:
        print(f"batch.py: error: {e}", file=sys.stderr)
        return EXIT_STATUS_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
