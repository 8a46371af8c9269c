"""The Ray executor: one Ray Core task per grid point, across the hosts of a Ray cluster.

Each task asks for one GPU (`num_gpus=1`, Ray sets `CUDA_VISIBLE_DEVICES`) or, on a CPU sweep,
a share of cores (`num_cpus`, passed on as `OMP_NUM_THREADS`), and runs the same study
subprocess as the local executor (`point.run_point`).

How results reach --out (`--transfer`):
- `shared`: the worker writes the point's folder straight into --out. Needs --out at the same
  path on every host (NFS, a cluster file system, or one machine).
- `copy`: the worker runs the study in a temporary folder on its own disk and returns the folder
  as one tar.gz (bytes, through Ray's object store); the driver unpacks it into --out. A
  partial folder from an earlier run is sent along, so the study resumes on the worker.
- `auto` (default): `shared` when the worker reads the sweep's token file at --out's path
  (written by the driver with a random token at start), else `copy`, decided per task.
Either way the data, calibration images, recipe files and checkpoints are read by the worker at
the paths in the sweep file: they must exist on every host.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from quantstudy.record.errors import UserError
from quantstudy.sweep.caches import host_cache_env
from quantstudy.sweep.events import Job, SweepEvents, Transfer
from quantstudy.sweep.grid import GridPoint
from quantstudy.sweep.local import cpu_threads, threads_env
from quantstudy.sweep.point import STOP_GRACE_S, PointStatus, record_failure, run_point

TOKEN_FILE = ".sweep-token"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(
            "--executor ray needs Ray: pip install 'quantstudy[ray]' (or use --executor local)"
        ) from None
    return ray


def pack(folder: Path) -> bytes:
    """The folder's files as a tar.gz, names relative to the folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def unpack(blob: bytes, folder: Path) -> None:
    """Extract a `pack` archive into `folder`, over what is there (refuses paths outside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def _sees_shared(out: str, token: str) -> bool:
    try:
        return (Path(out) / TOKEN_FILE).read_text(encoding="utf-8") == token
    except OSError:
        return False


def run_task(
    point: GridPoint,
    folder: str,
    out: str,
    token: str,
    transfer: Transfer,
    resume: bytes | None,
    env: dict[str, str],
) -> tuple[PointStatus, bytes | None]:
    """The Ray task: run one point, in --out (shared) or in a temporary folder (copy)."""
    env = {**env, **host_cache_env()}
    stop = threading.Event()
    shared = _sees_shared(out, token)
    if transfer == "shared" and not shared:
        raise UserError(
            f"--transfer shared, but the worker on this host does not see {out}: mount it on "
            "every host or use --transfer copy"
        )
    if shared and transfer != "copy":
        return run_point(point, Path(out) / folder, env, stop), None
    with tempfile.TemporaryDirectory(prefix="quantstudy-sweep-") as tmp:
        local = Path(tmp) / folder
        if resume is not None:
            unpack(resume, local)
        status = run_point(point, local, env, stop, label=folder)
        return status, pack(local)


class RayExecutor:
    """Submits every job as a Ray task and collects results as they finish."""

    def __init__(
        self, device: str, address: str | None, transfer: Transfer, workers: int | None
    ) -> None:
        self.ray = import_ray()
        self.device = device
        self.address = address
        self.transfer = transfer
        self.workers = workers
        self.description = ""

    def _connect(self) -> bool:
        """Connect to --address, or start a local cluster; True if this call started Ray."""
        ray = self.ray
        if ray.is_initialized():
            return False
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(
                num_cpus=self.workers,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
        return True

    def _options(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Resources per task and the environment its study runs with."""
        if self.device == "cuda":
            return {"num_gpus": 1}, {}
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        threads = cpu_threads(self.workers or cpus) if self.workers else 1
        return {"num_cpus": threads}, threads_env(threads)

    def run(self, jobs: list[Job], out: Path, events: SweepEvents, stop: threading.Event) -> None:
        ray = self.ray
        started_here = self._connect()
        try:
            self._run(jobs, out, events, stop)
        finally:
            if started_here:
                ray.shutdown()

    def _run(self, jobs: list[Job], out: Path, events: SweepEvents, stop: threading.Event) -> None:
        ray = self.ray
        token = secrets.token_hex(16)
        (out / TOKEN_FILE).write_text(token, encoding="utf-8")
        options, env = self._options()
        resources = ray.cluster_resources()
        self.description = (
            f"ray: {int(resources.get('GPU', 0))} GPU(s), {int(resources.get('CPU', 0))} CPU(s) "
            f"in the cluster, {options} per study, transfer {self.transfer}"
        )
        task = ray.remote(run_task).options(max_retries=0, **options)
        pending: dict[Any, Job] = {}
        for job in jobs:
            folder = out / job.folder
            resume = pack(folder) if self.transfer != "shared" and folder.is_dir() else None
            ref = task.remote(job.point, job.folder, str(out), token, self.transfer, resume, env)
            pending[ref] = job
            events.started(job, "ray")
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in done:
                    self._collect(ref, pending.pop(ref), out, events)
        except KeyboardInterrupt:
            stop.set()
            for ref in pending:
                ray.cancel(ref)  # a KeyboardInterrupt in the task: it stops its study cleanly
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=STOP_GRACE_S + 10)
            for ref in done:
                self._collect(ref, pending.pop(ref), out, events)
            raise

    def _collect(self, ref: Any, job: Job, out: Path, events: SweepEvents) -> None:
        """Unpack a copied folder into --out and report the point's status."""
        try:
            status, blob = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return  # cancelled before it started: still pending on the next run
        except self.ray.exceptions.RayError as err:  # a worker or node lost, or a task bug
            cause = err.as_instanceof_cause() if hasattr(err, "as_instanceof_cause") else err
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            error = f"Ray task failed: {type(err).__name__}: {str(err).strip().splitlines()[0]}"
            events.finished(job, record_failure(out / job.folder, job.point, error))
            return
        if blob is not None:
            unpack(blob, out / job.folder)
        events.finished(job, status)
