"""The provenance every bench record carries, collected where the figures are measured."""

from __future__ import annotations

import shlex
import sys

import torch

from quantstudy.bench.schema import Provenance
from quantstudy.env.switches import lab_switches, switches_said
from quantstudy.record.errors import UserError
from quantstudy.study.environment import collect_environment

CPU_REASON = "measured on a CPU: timings do not predict GPU engines"


def collect_provenance(
    device: torch.device, argv: list[str] | None = None, program: str = "quantstudy"
) -> Provenance:
    """The command line (`program`, then `argv`, default this process's arguments), commit,
    device and versions. A script of `tools/` names itself as `program`."""
    env = collect_environment(device)
    words = [*program.split(), *(sys.argv[1:] if argv is None else argv)]
    return Provenance(
        command=shlex.join(words),
        git_commit=env.git_commit,
        created_utc=env.created_utc,
        device=device.type,
        gpu_name=env.gpu_name,
        gpu_driver=env.gpu_driver,
        gpu_capability=env.gpu_capability,
        cuda=env.cuda,
        cudnn=env.cudnn,
        torch=env.torch,
        triton=env.triton,
        timm=env.timm,
        python=env.python,
        lab_switches=switches_said(lab_switches()),
    )


def need_cuda(what: str, hint: str = "") -> torch.device:
    """The CUDA device, or a `UserError` saying `what` needs one (and `hint`: what runs here)."""
    if not torch.cuda.is_available():
        raise UserError(f"{what} needs a CUDA GPU; PyTorch sees none here{hint}")
    return torch.device("cuda")
