"""The environment a study ran in, recorded automatically (pyperf's habit)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

import numpy
import timm
import torch

from quantstudy.env.machine import Machine
from quantstudy.env.switches import lab_switches
from quantstudy.record import Environment
from quantstudy.record.version import __version__


def _git_commit() -> str | None:
    """The commit of the quantstudy checkout, when it runs from one.

    QUANTSTUDY_GIT_COMMIT, when set, wins: a copied tree (a remote GPU machine) may carry a
    `.git` whose HEAD is not the code that was copied (an older HEAD then reports "+dirty").
    """
    named = os.environ.get("QUANTSTUDY_GIT_COMMIT")
    if named:
        return named
    root = Path(__file__).resolve().parents[3]  # src/quantstudy/study/ -> the checkout
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=5,
    ).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def collect_environment(device: torch.device) -> Environment:
    """Versions, hardware and time of this run; the GPU fields only when it uses CUDA (the
    device and torch's and Triton's versions as `env/machine.py` names them)."""
    machine = Machine.of(device)
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        cpu=_cpu_name(),
        cpu_count=os.cpu_count() or 0,
        torch_threads=torch.get_num_threads(),
        torch=machine.torch,
        timm=timm.__version__,
        numpy=numpy.__version__,
        triton=machine.triton,
        cuda=machine.cuda,
        cudnn=machine.cudnn,
        gpu_name=machine.gpu_name,
        gpu_driver=_gpu_driver() if machine.gpu_name is not None else None,
        gpu_capability=machine.gpu_capability,
        quantstudy=__version__,
        git_commit=_git_commit(),
        created_utc=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        lab_switches=lab_switches() or None,
    )
