"""The Python API's tiny study, one config for the CPU test (tests/unit/test_api_study.py) and
the GPU one (tests/gpu/test_api_gpu.py): timm's `test_vit` with seeded random weights (no
BatchNorm, so the study uses the weights as `quantize` gets them), its calibration images from a
folder of their own, 12 held-out images, no timing."""

from __future__ import annotations

from pathlib import Path

import quantstudy
from tests.unit._tiny_data import write_tiny_imagenet

RECIPE = "generic_default"


def api_study_config(
    root: Path, device: str, *, per_class: int = 6, size: int = 48
) -> quantstudy.StudyConfig:
    """The study under `root` (`data/`, `calib/`, `study/`) on `device`; each image folder holds
    `per_class` random `size` x `size` JPEGs per class."""
    data, calib = (
        write_tiny_imagenet(root / name, seed=seed, per_class=per_class, size=size)
        for name, seed in (("data", 1), ("calib", 2))
    )
    return quantstudy.StudyConfig(
        model="test_vit",
        weights="random",
        data=data,
        calib_data=calib,
        calib=6,
        heldout=12,
        device=device,
        batches=(1, 2),
        speed=False,
        recipe=RECIPE,
        out=root / "study",
    )
