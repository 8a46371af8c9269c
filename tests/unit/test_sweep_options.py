"""A sweep takes every study option from `StudyConfig` itself: each can be shared or swept, each
value is checked as the study checks it, at its own line, without crossing types."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.sweep.grid import expand
from quantstudy.sweep.spec import OPTIONS, load_sweep

HEAD = "models:\n  - {name: test_efficientnet, weights: random}\n"
# A value of every study option a sweep takes, other than its default; a new `StudyConfig` field
# fails `test_every_study_option_is_listed_here` until it is given one here.
EXAMPLES: dict[str, Any] = {
    "weights": "random",
    "data": "images",
    "calib_data": "images",
    "recipe": "generic_all",
    "calib": 7,
    "heldout": 9,
    "seed": 3,
    "device": "cpu",
    "batches": [1, 4],
    "compile_mode": "max-autotune",
    "fp8_kernel": "scaled_mm",
    "fp8_accumulate": "promote128",
    "test_settings": True,
    "float32_engine": True,
    "policy": "strict",
    "class_list": "classes.txt",
    "strip_prefix": "module.",
    "eval_batch": 16,
    "speed": False,
    "quality": False,
    "package": True,
}


def _expected(option: str, folder: Path) -> Any:
    value = EXAMPLES[option]
    if option in ("data", "calib_data", "class_list"):
        return str((folder / value).resolve())
    return tuple(value) if isinstance(value, list) else value


def _sweep(folder: Path, text: str) -> Path:
    (folder / "images").mkdir(exist_ok=True)
    (folder / "classes.txt").write_text("n01440764\n")
    path = folder / "sweep.yaml"
    path.write_text(text)
    return path


def _error(folder: Path, text: str) -> str:
    with pytest.raises(UserError) as err:
        load_sweep(_sweep(folder, text))
    return str(err.value)


def test_every_study_option_is_listed_here():
    assert set(EXAMPLES) == set(OPTIONS) == set(StudyConfig.model_fields) - {"model", "out"}


@pytest.mark.parametrize("option", sorted(EXAMPLES))
def test_every_study_option_can_be_shared(tmp_path, option):
    settings = {"data": "images"} | {option: EXAMPLES[option]}
    (point,) = expand(load_sweep(_sweep(tmp_path, HEAD + yaml.safe_dump(settings))), "cpu")
    assert getattr(point.config, option) == _expected(option, tmp_path)


@pytest.mark.parametrize("option", sorted(set(EXAMPLES) - {"data", "device"}))
def test_every_study_option_can_be_swept(tmp_path, option):
    """Each but the device: a sweep's studies run where its executor does."""
    default = StudyConfig.model_fields[option].default
    default = str(default) if isinstance(default, StrEnum) else default
    values = [EXAMPLES[option]] if default is None else [EXAMPLES[option], default]
    if option == "batches":
        values = [[1, 4], [2]]
    text = HEAD + yaml.safe_dump({"data": "images", "grid": {option: values}})
    points = expand(load_sweep(_sweep(tmp_path, text)), "cpu")
    assert len(points) == len(values) == len({p.folder_name for p in points})
    assert getattr(points[0].config, option) == _expected(option, tmp_path)
    if option not in ("recipe", "seed", "fp8_kernel"):  # said by every label already
        assert f"{option}=" in points[0].label


def test_a_swept_accumulation_doubles_the_grid_and_is_said(tmp_path):
    text = HEAD + "seeds: [0, 1]\ndata: images\ngrid:\n  fp8_accumulate: [fast, promote128]\n"
    points = expand(load_sweep(_sweep(tmp_path, text)), "cpu")
    assert [(p.config.seed, str(p.config.fp8_accumulate)) for p in points] == [
        (0, "fast"), (0, "promote128"), (1, "fast"), (1, "promote128"),
    ]  # fmt: skip
    assert points[1].label.endswith("/ fused / fp8_accumulate=promote128")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a boolean is not a number, nor a number a boolean (YAML `true` would be 1 image)
        ("calib: true\n", "line 4: calib: True is a boolean, not a value of this option"),
        ("speed: 1\n", "line 4: speed: 1 is not a boolean: give true or false"),
        ("grid:\n  batches: [[1, true]]\n", "line 5: grid.batches.0: [1, True] is a boolean"),
        ("seeds: [0, true]\n", "line 4: seeds.1: True is a boolean"),
        # bounds name the file, the line and the key, and say why
        ("seeds: [0, -1]\n", "line 4: seeds.1: Input should be greater than or equal to 0"),
        ("batches: [1, 100000]\n", "line 4: batches.1: Input should be less than or equal to 4096"),
        ("grid:\n  heldout: [8, 0]\n", "line 5: grid.heldout.1: must be a positive image count"),
        ("device: tpu\n", "line 4: device: Input should be 'cpu' or 'cuda' (got 'tpu')"),
        # an empty selection is refused, never read as the default
        ("seeds: []\n", "line 4: seeds: give a list of at least one value"),
        ("grid:\n  fp8_accumulate: []\n", "line 5: grid.fp8_accumulate: give a list of at least"),
        ("calibrators: []\n", "line 4: calibrators: is empty: list at least one"),
        # one option, one place
        ("seeds: [0]\nseed: 1\n", "line 5: seed: seed is also swept; give one"),
        ("seeds: [0]\ngrid:\n  seed: [1]\n", "line 6: grid.seed: seeds sweeps seed already"),
        ("grid:\n  calib: [4]\ncalib: 5\n", "line 5: grid.calib: calib is also shared"),
        ("grid:\n  model: [resnet18]\n", "line 5: grid.model: unknown study option 'model'"),
        ("grid:\n  device: [cpu]\n", "line 5: grid.device: a sweep's studies run on one device"),
        ("out: o\n", "line 4: out: unknown key 'out'"),
        # what its studies would refuse, refused as the file is read (a dry run too)
        ("recipes: [default, nope]\n", "line 4: recipes.1: unknown recipe 'nope'"),
        ("grid:\n  recipe: [generic_all, nope.yaml]\n", "line 5: grid.recipe.1: recipe file"),
        ("weights: gone.pth\n", "line 4: weights: checkpoint"),
        ("policy: missing.yaml\n", "line 4: policy: policy not found"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_file_and_line(tmp_path, text, expected):
    message = _error(tmp_path, HEAD + "data: images\n" + text)
    assert message.startswith(str(tmp_path / "sweep.yaml")) and expected in message
    assert not re.search(r"--(seed|batches|calib|heldout|speed)\b", message)  # not given


def test_options_that_do_not_go_together_name_the_file(tmp_path):
    text = HEAD + "data: images\nspeed: false\nquality: false\n"
    with pytest.raises(UserError, match=r"sweep.yaml: the study of test_efficientnet: "):
        expand(load_sweep(_sweep(tmp_path, text)), "cpu")
