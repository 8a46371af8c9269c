"""One small real study for the bridge tests, made once per test session.

A random-weight `test_efficientnet` (timm's tiny test model, 160x160 input) studied on CPU with
the generic_pointwise recipe on 12 generated images, then exported: the bridge's tests need a
record whose scales came from a real calibration, and an ONNX exported from it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from quantstudy.cli import main

_MADE: dict[str, Path] = {}


def small_study(root: Path) -> Path:
    """The study folder (with `tensorrt/model.onnx` exported), made at most once."""
    if "study" in _MADE:
        return _MADE["study"]
    data = root / "data"
    g = torch.Generator().manual_seed(0)
    for wnid in ("n01440764", "n01443537"):
        (data / wnid).mkdir(parents=True)
        for i in range(6):
            pixels = (torch.rand(48, 48, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(data / wnid / f"img{i}.jpg")
    study = root / "study"
    args = "run test_efficientnet --weights random --device cpu --calib 4 --heldout 8 "
    args += f"--batches 1,2 --recipe generic_pointwise --no-speed --data {data} --out {study}"
    main(args.split())  # the outcome of a random-weight study is inconclusive; its record is whole
    assert (study / "study.json").is_file()
    assert main(["export", str(study)]) == 0
    _MADE["study"] = study
    return study
