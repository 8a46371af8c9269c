"""Which GPU, torch, CUDA and Triton this process runs on: the one reader of the names every
record and cache gives them (a study's environment, a bench record's provenance, a zoo row's, a
package's manifest, the keys of the kernel choice's timings and of the tuned launches).

Read here only, so that two records or caches made on one machine name it alike. torch and
Triton are imported when asked for, not at import: this is the bottom floor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import device as TorchDevice  # `Machine.torch` names a version in its body


@functools.cache
def triton_version() -> str | None:
    """The version of the Triton this process imports (`triton.__version__`); None: no Triton
    (a CPU build of torch)."""
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def cuda_version() -> str | None:
    """The CUDA torch was built with ("12.8"); None: a CPU build of torch."""
    import torch

    cuda: str | None = torch.version.cuda
    return cuda


def gpu_name(device: torch.device) -> str | None:
    """The CUDA device's name ("NVIDIA H100 80GB HBM3"); None for any other device."""
    import torch

    return str(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def gpu_capability(device: torch.device) -> tuple[int, int]:
    """The CUDA device's compute capability, (9, 0) on Hopper; `device` "cuda" is the current
    one."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def device_label(device: torch.device) -> str:
    """What a cache keys a device by: the GPU's name, else the device type ("cpu")."""
    return gpu_name(device) or device.type


@dataclass(frozen=True)
class Machine:
    """The device and versions a measurement ran on; the GPU fields None off CUDA."""

    torch: str
    triton: str | None
    cuda: str | None = None  # the CUDA torch was built with
    cudnn: str | None = None
    gpu_name: str | None = None
    gpu_capability: str | None = None  # "9.0"

    @classmethod
    def of(cls, device: TorchDevice) -> Machine:
        import torch

        if device.type != "cuda":
            return cls(torch_version(), triton_version())
        major, minor = gpu_capability(device)
        return cls(
            torch=torch_version(),
            triton=triton_version(),
            cuda=cuda_version(),
            cudnn=str(torch.backends.cudnn.version()),
            gpu_name=gpu_name(device),
            gpu_capability=f"{major}.{minor}",
        )
