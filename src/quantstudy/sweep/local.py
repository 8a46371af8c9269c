"""The local executor: worker threads on this host, each running one study subprocess at a time.

On a GPU host there is one worker per visible GPU, each study pinned to its GPU with
`CUDA_VISIBLE_DEVICES` (studies time their engines: two on one GPU would time each other). On a
CPU host there are N workers and the cores are divided between them (`OMP_NUM_THREADS`, which
torch reads at start-up), so N studies do not oversubscribe the cores.

`jobs` > 1 on a GPU host puts that many workers on each GPU, so one study's compiles and tile
tuning overlap another's: the cores are divided between them (torch, Inductor's and Triton's
compile threads), and every timing takes the GPU's lock file (`gpu/timing_lock.py`), so no
two timings share the GPU.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

from quantstudy.gpu.timing_lock import LOCK_ENV
from quantstudy.record.errors import UserError
from quantstudy.sweep.caches import host_cache_env
from quantstudy.sweep.events import Job, SweepEvents
from quantstudy.sweep.point import run_point


@dataclass(frozen=True)
class Slot:
    """One worker: a name for progress lines and the environment its studies run with."""

    name: str
    env: dict[str, str]


def visible_gpus() -> list[str]:
    """GPU ids this process may use: `CUDA_VISIBLE_DEVICES` if set, else all torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def threads_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def cpu_threads(workers: int) -> int:
    """Cores per CPU worker: this host's cores divided between `workers`, at least 1."""
    return max(1, (os.cpu_count() or 1) // workers)


def default_jobs(device: str) -> int:
    """Studies per GPU by default: a core or four each for compiles, at most four (GPU memory
    for four studies' engines at batch 128 fits an 80 GB card with room); 1 on the CPU."""
    return max(1, min(4, (os.cpu_count() or 1) // 4)) if device == "cuda" else 1


def shared_gpu_env(gpu: str, jobs: int, gpus: int, lock_dir: Path) -> dict[str, str]:
    """A worker's environment when `jobs` studies share GPU `gpu` (module docstring)."""
    threads = cpu_threads(jobs * gpus)
    return {
        "CUDA_VISIBLE_DEVICES": gpu,
        LOCK_ENV: str(lock_dir / f".timing-gpu{gpu}.lock"),
        "TORCHINDUCTOR_COMPILE_THREADS": str(threads),
        "QUANTSTUDY_TRITON_COMPILE_THREADS": str(threads),
        **threads_env(threads),
    }


def local_slots(
    device: str, workers: int | None, jobs: int = 1, lock_dir: Path | None = None
) -> list[Slot]:
    """The workers of this host for `device`; `workers` None: one per GPU, or one per core;
    `jobs` studies per GPU, timing behind a lock file in `lock_dir` (module docstring)."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: give at least 1 study per GPU")
    if device == "cuda":
        gpus = visible_gpus()
        if not gpus:
            raise UserError(
                "the sweep's device is cuda, but no GPU is visible here; set device: cpu"
            )
        if workers is not None and workers > len(gpus):
            raise UserError(
                f"--workers {workers} but {len(gpus)} GPU(s) visible: studies time their engines, "
                "so each needs a GPU of its own; give at most one worker per GPU"
            )
        chosen = gpus[: workers or len(gpus)]
        if jobs == 1 or lock_dir is None:
            return [Slot(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": g}) for g in chosen]
        return [
            Slot(f"gpu{g}.{j}", shared_gpu_env(g, jobs, len(chosen), lock_dir))
            for j in range(jobs)
            for g in chosen
        ]
    count = workers or (os.cpu_count() or 1)
    threads = cpu_threads(count)
    return [
        Slot(f"cpu{i}", {"CUDA_VISIBLE_DEVICES": "", **threads_env(threads)}) for i in range(count)
    ]


class LocalExecutor:
    """Runs jobs on `slots`, one study per slot at a time, until done or stopped."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.description = f"local: {len(slots)} worker(s) ({', '.join(s.name for s in slots)})"

    def run(self, jobs: list[Job], out: Path, events: SweepEvents, stop: threading.Event) -> None:
        """Run every job; on KeyboardInterrupt, stop the running studies cleanly and re-raise."""
        todo: queue.Queue[Job] = queue.Queue()
        for job in jobs:
            todo.put(job)

        finished = [threading.Event() for _ in self.slots[: max(1, len(jobs))]]

        def work(slot: Slot, done: threading.Event) -> None:
            try:
                while not stop.is_set():
                    try:
                        job = todo.get_nowait()
                    except queue.Empty:
                        return
                    events.started(job, slot.name)
                    env = {**slot.env, **host_cache_env()}
                    status = run_point(job.point, out / job.folder, env, stop)
                    events.finished(job, status)
            finally:
                done.set()

        for slot, done in zip(self.slots, finished, strict=False):
            threading.Thread(target=work, args=(slot, done), name=slot.name, daemon=True).start()
        # Events, not Thread.join: a KeyboardInterrupt inside join() can leave the thread
        # looking finished while it still stops its study and writes point.json.
        try:
            for done in finished:
                while not done.wait(timeout=0.2):
                    pass
        except KeyboardInterrupt:
            stop.set()
            for done in finished:
                done.wait()
            raise
