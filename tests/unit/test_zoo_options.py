"""The zoo takes every study option from `StudyConfig` itself: each has its flag on `quantstudy zoo`
and reaches every study of the list, with the zoo's own defaults where it has them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from quantstudy.record import StudyConfig
from quantstudy.record.inputs import option
from quantstudy.zoo.catalogue import ZooEntry
from quantstudy.zoo.commands import _arguments, zoo_options
from quantstudy.zoo.points import ZOO_DEFAULTS, ZOO_OWN, ZOO_STUDY_OPTIONS, row_settings, zoo_point

# A command-line value of every study option the zoo takes and what its studies' config holds
# then; a new `StudyConfig` field fails `test_every_study_option_is_listed_here` until given here.
FLAGS: dict[str, tuple[list[str], Any]] = {
    "calib_data": (["images"], "images"),
    "recipe": (["generic_all"], "generic_all"),
    "calib": (["7"], 7),
    "heldout": (["9"], 9),
    "seed": (["3"], 3),
    "device": (["cpu"], "cpu"),
    "batches": (["1,4"], (1, 4)),
    "compile_mode": (["max-autotune"], "max-autotune"),
    "fp8_kernel": (["scaled_mm"], "scaled_mm"),
    "fp8_accumulate": (["promote128"], "promote128"),
    "test_settings": ([], True),
    "float32_engine": ([], True),
    "policy": (["strict"], "strict"),
    "class_list": (["classes.txt"], "classes.txt"),
    "strip_prefix": (["module."], "module."),
    "eval_batch": (["16"], 16),
    "speed": ([], False),
    "quality": ([], False),
    "package": ([], True),
}


def _parse(folder: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _arguments(parser)
    argv = ["--data", str(folder / "images"), "--out", str(folder), *argv]
    return parser.parse_args(argv, argparse.Namespace(argv=["zoo", *argv]))


def test_every_study_option_is_listed_here():
    assert set(FLAGS) == set(ZOO_STUDY_OPTIONS) == set(StudyConfig.model_fields) - set(ZOO_OWN)


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_every_study_option_reaches_the_zoo_s_studies(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    values, expected = FLAGS[name]
    default = StudyConfig.model_fields[name].default
    flag = option(f"no_{name}") if default is True else option(name)
    # a prefix is for a checkpoint, the float32 engine and speed off need quality: real weights
    real = name in ("strip_prefix", "float32_engine", "speed")
    mode = ["--weights", "cache"] if real else []
    options = zoo_options(_parse(tmp_path, flag, *values, *mode))
    entry = ZooEntry(name="resnet18", weights="w" if real else None)
    config = zoo_point(entry, options, "cuda").config
    if name in ("calib_data", "class_list"):
        expected = str(tmp_path / expected)  # made absolute: the study runs in its folder
    if name == "device":  # the device the zoo resolved, passed to every point
        config = zoo_point(entry, options, options.device or "cuda").config
    assert getattr(config, name) == expected
    if name not in ("calib_data", "class_list", "device", "speed", "quality"):
        assert name in row_settings(zoo_point(entry, options, "cuda"))  # a row says it


def test_without_options_the_zoo_s_defaults_and_the_old_row_settings(tmp_path):
    options = zoo_options(_parse(tmp_path))
    point = zoo_point(ZooEntry(name="resnet18"), options, "cuda")
    c = point.config
    assert (c.batches, c.calib, c.heldout, str(c.fp8_kernel)) == (
        ZOO_DEFAULTS["batches"], ZOO_DEFAULTS["calib"], ZOO_DEFAULTS["heldout"], "fused",
    )  # fmt: skip
    assert not c.quality and c.speed and c.weights == "random"
    # what rows committed before the zoo took every option hold: such a row stays fresh
    assert set(row_settings(point)) == {
        "weights", "recipe", "batches", "calib", "heldout", "fp8_kernel",
    }  # fmt: skip


def test_no_quality_keeps_a_real_weights_study_speed_only(tmp_path):
    entry = ZooEntry(name="resnet18", weights="w")
    full = zoo_options(_parse(tmp_path, "--weights", "cache"))
    assert zoo_point(entry, full, "cuda").config.quality
    fast = zoo_options(_parse(tmp_path, "--weights", "cache", "--no-quality"))
    assert not zoo_point(entry, fast, "cuda").config.quality
