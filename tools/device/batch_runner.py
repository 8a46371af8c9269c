"""`Batch`: start the jobs on the GPUs, stop them at the budget, record each in batch.json
(`batch.py` says what each job is given and how they are chosen)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from batch_jobs import JobsError, Spec

RECORD = "batch.json"
FORMAT = 1
POLL_S = 0.05
Slot = tuple[str, str | None]  # (CUDA_VISIBLE_DEVICES id, GPU name)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _hear_stops() -> None:
    """In a job's process: the stops its runner held back while starting it reach the job."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@dataclass
class Job:
    """One job's state as the batch goes; `record()` is its entry in batch.json."""

    spec: Spec
    status: str = "pending"  # running, ok, failed, stopped, not_run
    why: str | None = None
    slot: Slot | None = None  # (CUDA_VISIBLE_DEVICES id, GPU name)
    start: float | None = None  # monotonic
    end: float | None = None
    start_utc: str | None = None
    exit: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    stop_sent: float | None = None
    stop_why: str | None = None
    co_runners: set[str] = field(default_factory=set)
    pack: str | None = None  # the bundle holding its folder, or why it is not returned

    def record(self, t0: float) -> dict[str, object]:
        wall = None if self.start is None or self.end is None else round(self.end - self.start, 1)
        return {
            "name": self.spec.name,
            "command": self.spec.run,
            "minutes": self.spec.minutes,
            "after": list(self.spec.after),
            "status": self.status,
            "why": self.why,
            "exit": self.exit,
            "gpu": self.slot and self.slot[0],
            "gpu_name": self.slot and self.slot[1],
            "start_utc": self.start_utc,
            "start_s": None if self.start is None else round(self.start - t0, 1),
            "wall_s": wall,
            "co_runners": sorted(self.co_runners),
            "pack": self.pack,
        }


def host_gpus() -> list[dict[str, str]]:
    """The host's GPUs as nvidia-smi lists them (index, name, driver); none without it."""
    query = ["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"]
    try:
        text = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]
    return [{"index": r[0], "name": r[1], "driver": r[2]} for r in rows if len(r) == 3]


def gpu_slots(found: list[dict[str, str]], count: int | None) -> list[Slot]:
    """(CUDA_VISIBLE_DEVICES id, name) of each GPU the jobs take: the first `count` of those
    found, or `count` numbered ones where none is found (a host without nvidia-smi)."""
    if count is not None and count < 1:
        raise JobsError(f"--gpus {count}: give at least 1")
    if not found:
        if count is None:
            raise JobsError("nvidia-smi lists no GPU here; give --gpus N to run N jobs at once")
        return [(str(i), None) for i in range(count)]
    if count is not None and count > len(found):
        raise JobsError(
            f"--gpus {count} but this host has {len(found)} GPU(s); give at most {len(found)}"
        )
    return [(g["index"], g["name"]) for g in found[: count or len(found)]]


def _utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Batch:
    """The jobs of one call on `slots`; `run()` starts, stops and records them (module
    docstring)."""

    def __init__(
        self,
        specs: list[Spec],
        slots: list[Slot],
        out: Path,
        work: Path,
        budget: float,
        grace: float,
        host: dict[str, object],
    ) -> None:
        self.jobs = [Job(s) for s in specs]
        self.slots = slots
        self.out, self.work, self.budget, self.grace = out, work, budget, grace
        self.host = host
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        self.started_utc = _utc()
        self.packed: list[str] = []
        self.finished = False

    # --- the record ------------------------------------------------------------------------
    def write(self) -> None:
        record = {
            "format": FORMAT,
            "started_utc": self.started_utc,
            "budget_s": self.budget,
            "grace_s": self.grace,
            "wall_s": round(time.monotonic() - self.t0, 1),
            "finished": self.finished,
            "cwd": str(Path.cwd()),
            "gpus_used": [s[0] for s in self.slots],
            **self.host,
            "jobs": [j.record(self.t0) for j in self.jobs],
            "packed": self.packed,
        }
        write_json_atomic(self.out / RECORD, record)

    # --- running ---------------------------------------------------------------------------
    def run(self) -> None:
        free = list(self.slots)
        while True:
            for job in self._running():
                self._watch(job, free)
            self._start_ready(free)
            if not self._running() and all(j.status != "pending" for j in self.jobs):
                return
            time.sleep(POLL_S)

    def _running(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "running"]

    def _ready(self) -> list[Job]:
        ended = {j.spec.name for j in self.jobs if j.status not in ("pending", "running")}
        ready = [j for j in self.jobs if j.status == "pending" and set(j.spec.after) <= ended]
        if len(self.slots) > 1:  # longest first; on one GPU the file's order is the priority
            ready.sort(key=lambda j: -j.spec.minutes)
        return ready

    def _start_ready(self, free: list[Slot]) -> None:
        status = {j.spec.name: j.status for j in self.jobs}
        for job in self._ready():
            left = self.deadline - time.monotonic()
            if job.spec.after and all(status[a] == "not_run" for a in job.spec.after):
                job.status, job.why = "not_run", "none of the jobs it comes after ran"
                self._not_run(job)
            elif job.spec.minutes * 60 > left:
                job.status = "not_run"
                job.why = (
                    f"expected {job.spec.minutes:g} min; {max(left, 0):.0f} s of the "
                    f"{self.budget:g} s budget were left when it could start"
                )
                self._not_run(job)
            elif free:
                self._start(job, free.pop(0), left)

    def _not_run(self, job: Job) -> None:
        print(f"batch: {job.spec.name} not run: {job.why}", flush=True)
        self.write()

    def _start(self, job: Job, slot: Slot, left: float) -> None:
        folder = self.work / "jobs" / job.spec.name
        tmp = self.work / "tmp" / job.spec.name
        folder.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            CUDA_VISIBLE_DEVICES=slot[0],
            OUT=str(folder),
            TMPDIR=str(tmp),
            BATCH_JOBS=str(self.work / "jobs"),
            BATCH_JOB=job.spec.name,
            JOB_BUDGET_S=str(int(left)),
        )
        log = open(
            folder / "batch-job.log", "wb"
        )  # the child writes it; closed here once it holds it
        # A stop (Ctrl-C, SIGTERM) between the job's start and its "running" would leave a job
        # that runs recorded as never started, and never stopped: held back until it is recorded.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            job.proc = subprocess.Popen(
                ["bash", "-c", job.spec.run],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_hear_stops,
            )
            job.status, job.slot = "running", slot
            job.start, job.start_utc = time.monotonic(), _utc()
        finally:
            log.close()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        print(f"batch: {job.spec.name} started on GPU {slot[0]}", flush=True)
        self.write()

    def _watch(self, job: Job, free: list[Slot]) -> None:
        assert job.proc is not None
        now = time.monotonic()
        if job.proc.poll() is not None:
            self._finish(job, free)
        elif job.stop_sent is None and now >= self.deadline:
            self.stop(job, f"ran past the batch's {self.budget:g} s budget")
        elif job.stop_sent is not None and now >= job.stop_sent + self.grace:
            _killpg(job.proc.pid, signal.SIGKILL)

    def stop(self, job: Job, why: str) -> None:
        """Ctrl-C to the job's whole group; `_watch` kills it after the grace period."""
        assert job.proc is not None
        job.stop_sent, job.stop_why = time.monotonic(), why
        _killpg(job.proc.pid, signal.SIGINT)

    def _finish(self, job: Job, free: list[Slot]) -> None:
        assert job.proc is not None and job.start is not None
        _killpg(job.proc.pid, signal.SIGKILL)  # what it left running in its group
        job.end, job.exit = time.monotonic(), job.proc.returncode
        if job.stop_why is not None:
            job.status, job.why = "stopped", job.stop_why
        else:
            job.status = "ok" if job.exit == 0 else "failed"
        for other in self.jobs:
            if other is not job and other.start is not None and other.start < job.end:
                if other.end is None or other.end > job.start:
                    job.co_runners.add(other.spec.name)
        if job.slot is not None:
            free.append(job.slot)
            free.sort(key=self.slots.index)
        print(
            f"batch: {job.spec.name} {job.status} (exit {job.exit}) in {job.end - job.start:.1f} s",
            flush=True,
        )
        self.write()

    def interrupt(self) -> None:
        """The runner itself was stopped: stop every job, record the rest as not run."""
        for job in self._running():
            self.stop(job, "the batch runner was stopped")
        end = time.monotonic() + self.grace
        while self._running() and time.monotonic() < end:
            for job in self._running():
                if job.proc is not None and job.proc.poll() is not None:
                    self._finish(job, [])
            time.sleep(POLL_S)
        for job in self._running():
            assert job.proc is not None
            _killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
            self._finish(job, [])
        for job in self.jobs:
            if job.status == "pending":
                job.status, job.why = "not_run", "the batch runner was stopped"
        self.write()
