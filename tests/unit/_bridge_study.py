"""One small real study for the bridge tests, made once per test session.

A random-weight `test_efficientnet` (timm's tiny test model, 160x160 input) studied on CPU with
the generic_pointwise recipe on 12 generated images, then exported: the bridge's tests need a
record whose scales came from a real calibration, and an ONNX exported from it.
"""

from __future__ import annotations

from pathlib import Path

from _tiny_data import write_tiny_imagenet

from quantstudy.cli import main

_MADE: dict[str, Path] = {}


def small_study(root: Path) -> Path:
    """The study folder (with `tensorrt/model.onnx` exported), made at most once."""
    if "study" in _MADE:
        return _MADE["study"]
    data = write_tiny_imagenet(root / "data", seed=0)
    study = root / "study"
    args = "run test_efficientnet --weights random --device cpu --calib 4 --heldout 8 "
    args += f"--batches 1,2 --recipe generic_pointwise --no-speed --data {data} --out {study}"
    main(args.split())  # the outcome of a random-weight study is inconclusive; its record is whole
    assert (study / "study.json").is_file()
    assert main(["export", str(study)]) == 0
    _MADE["study"] = study
    return study
