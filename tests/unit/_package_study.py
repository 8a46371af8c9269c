"""One small study with a weights file, for the package tests, made once per test session.

timm's tiny `test_efficientnet` (160x160) with seeded random weights saved to a checkpoint
file, studied on the CPU with the generic_pointwise recipe on 12 generated images: a record
whose weights digest the package checks, and whose FP8 layers run the torch arithmetic of the
fused ops (what AOTInductor can compile on a CPU).
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from _tiny_data import write_tiny_imagenet

from quantstudy.cli import main

_MADE: dict[str, Path] = {}


def package_study(root: Path) -> Path:
    """The study folder (its weights at `root/weights.pth`), made at most once."""
    if "study" in _MADE:
        return _MADE["study"]
    data = write_tiny_imagenet(root / "data", seed=1)
    torch.manual_seed(0)
    torch.save(timm.create_model("test_efficientnet").state_dict(), root / "weights.pth")
    study = root / "study"
    args = f"run test_efficientnet --weights {root / 'weights.pth'} --device cpu --calib 4 "
    args += f"--heldout 8 --batches 1,2 --recipe generic_pointwise --no-speed --data {data} "
    args += f"--out {study}"
    main(args.split())  # random weights: an inconclusive study; its record is whole
    assert (study / "study.json").is_file()
    _MADE["study"] = study
    return study
