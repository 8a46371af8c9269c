"""The manifest written beside the packages: what they compute and what they are bound to.

A user of a `.pt2` needs to know how to feed it (the preprocessing, the input's dtype, shape and
memory format), what comes out, which study it is the engine of (study digest, model, weights
digest, recipe), and what it runs on: AOTInductor compiles kernels for one GPU architecture and
links against one torch, so `bound_to` names the device, GPU, compute capability, torch and
CUDA; the shipped check refuses a machine that differs (`package/shipped_check.py`). The sample
outputs (sha256 of the FP8 package's float32 logits and their top-1 on a few recorded images)
let a user confirm a deployment computes what was packaged.
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any

import torch

from quantstudy.env.machine import Machine, cuda_version, torch_version, triton_version
from quantstudy.record import StudyRecord

MANIFEST_FILE = "manifest.json"
# 2: a `tiles` row gives its launch's kernel sizes by name (`sizes`: M, N, K, ...), the key the
# launchers record it under, where 1 gave the shapes of the launch's first two tensors.
MANIFEST_VERSION = 2
CHECK_SCRIPT = "check.py"
SAMPLE_FILE = "sample_images.pt"


def bound_to(device: torch.device) -> dict[str, str]:
    """This machine as a package built here is bound to it (`shipped_check.machine`'s keys)."""
    machine = Machine.of(device)
    bound = {"device": device.type, "torch": machine.torch}
    if device.type == "cuda":
        bound |= {
            "cuda": str(machine.cuda),
            "gpu": str(machine.gpu_name),
            "capability": str(machine.gpu_capability),
        }
    return bound


def versions() -> dict[str, str | None]:
    """The software the packages were compiled with (recorded; only torch and CUDA bind)."""
    return {
        "torch": torch_version(),
        "triton": triton_version(),
        "cuda": cuda_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def logits_sha256(logits: torch.Tensor) -> str:
    """sha256 of float32 logits' bytes: equal only where the same kernels ran on the same
    GPU (a bitwise fingerprint, not a tolerance)."""
    return hashlib.sha256(logits.float().contiguous().numpy().tobytes()).hexdigest()


def study_part(record: StudyRecord) -> dict[str, Any]:
    """The study the packages are the engines of."""
    recipe = record.recipe
    speed = record.speed
    return {
        "name": record.name,
        "digest": record.digest,
        "model": record.model.name,
        "architecture": record.model.architecture,
        "weights": record.model.weights_detail,
        "weights_sha256": record.model.weights_sha256,
        "random_weights": record.model.random_weights,
        "recipe": recipe.name if recipe else None,
        "fp8_layers": [d.name for d in recipe.selected] if recipe else [],
        "fp8_kernel": record.config.build_spec(switches={}).kernel,
        "study_device": str(record.config.device),
        "study_gpu": record.environment.gpu_name,
        "study_x": {str(b.batch): b.ratio.median for b in (speed.batches if speed else [])},
        "study_x_meaningful": bool(speed and speed.meaningful),
    }


def preprocessing_part(record: StudyRecord) -> dict[str, Any]:
    """How to feed the packages: the study's preprocessing, exactly as recorded."""
    return record.preprocessing.model_dump(mode="json")
