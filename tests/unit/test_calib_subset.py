"""tools/device/calib_subset.py: the calibration images a device call carries are the ones a
study takes from the whole folder, so a study (and the data tests) calibrate on the carried part
exactly as on the whole."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from quantstudy.data.folders import scan_folder
from quantstudy.data.split import split_items

TOOL = Path(__file__).resolve().parents[2] / "tools" / "device" / "calib_subset.py"
pytestmark = pytest.mark.committed("tools/device/calib_subset.py")


def _tool():
    spec = importlib.util.spec_from_file_location("calib_subset", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _calibration(folder: Path, n: int) -> list[str]:
    calib, _ = split_items([], n, 1, 0, calib_items=scan_folder(folder).items)
    return [item.id for item in calib]


def test_a_study_takes_the_same_images_from_the_carried_part(tiny_imagenet, tmp_path):
    subset = _tool().calibration_subset(tiny_imagenet, 5)
    assert len(subset) == 5 and len({p.parent for p in subset}) == 2  # both classes
    carried = tmp_path / "carried"
    for image in subset:
        (carried / image.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_imagenet / image, carried / image)
    assert _calibration(carried, 5) == _calibration(tiny_imagenet, 5)
