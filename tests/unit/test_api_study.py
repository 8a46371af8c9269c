"""The Python API on one tiny study: `run_study` and `load_study` (the typed record, its
figures), `load_engine` (the study's engines rebuilt from the record, its refusals), and the
FP8 model of `quantize` against the study's FP8 engine: the same logits, bit for bit, on the CPU.

The study: timm's `test_vit` with seeded random weights (no BatchNorm, so the study uses the
weights as `quantize` gets them), its calibration images from a folder of their own, 12
held-out images, no timing; about 15 s on one thread."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import quantstudy
from quantstudy.model.loading import load_model
from quantstudy.record import FP8Layout
from quantstudy.record.study import record_digest
from quantstudy.record.vocab import Engine
from quantstudy.study.engines import study_builders
from quantstudy.study.prepare import prepare_study
from tests.api_study import RECIPE, api_study_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> quantstudy.Study:
    return quantstudy.run_study(api_study_config(tmp_path_factory.mktemp("api"), "cpu"))


@pytest.fixture(scope="module")
def images(study) -> torch.Tensor:
    return torch.randn(5, 3, 160, 160, generator=torch.Generator().manual_seed(3))


def test_run_study_returns_the_typed_record_and_its_figures(study) -> None:
    assert study.record.status == "complete" and study.folder.is_dir()
    assert study.decision is not None and study.decision.outcome == "inconclusive"  # random
    assert bool(study) is False and study.quality is not None and study.speed is None
    assert study.report.is_file()
    figures = study.figures()
    assert list(figures) == ["kl.png"]  # no speed measured: no latency plot
    assert type(figures["kl.png"]).__name__ == "Figure" and figures["kl.png"].axes


def test_load_study_reads_the_same_record(study) -> None:
    loaded = quantstudy.load_study(study.folder)
    assert loaded.record == study.record and loaded.folder == study.folder


def test_quantize_computes_the_study_fp8_engine_logits(study, images) -> None:
    """The same weights, recipe, calibration images and options: `quantize`'s model, the FP8
    engine `load_engine` rebuilds from the record, and the study's own FP8 engine (its
    preparation and builder) give the same logits on the CPU, bit for bit: one code path
    builds all three, and the recorded scales are the calibrated floats, read back exactly."""
    config = study.record.config
    model = load_model("test_vit", "random", seed=config.seed).model
    fp8, plan = quantstudy.quantize(
        model, RECIPE, calibration=config.calib_data, calib=config.calib, device="cpu"
    )
    assert plan.calibration == study.record.calibration
    assert plan.engine.fp8_real == study.record.engine(Engine.FP8).fp8_real
    engine = quantstudy.load_engine(study.folder)
    prepared = prepare_study(config.replace(policy=None))
    builders = study_builders(
        config,
        prepared.model,
        prepared.example,
        prepared.plan,
        prepared.recipe.weights.fold_bn,
        torch.device("cpu"),
        config.build_spec(),
    )
    own = builders[Engine.FP8](FP8Layout())
    logits = fp8(images)
    assert torch.equal(logits, engine(images))
    assert torch.equal(logits, own(images))


def test_load_engine_rebuilds_the_other_engines(study, images) -> None:
    fp16 = quantstudy.load_engine(study.folder, "fp16")
    assert fp16.dtype == torch.bfloat16 and fp16(images).shape == (5, 1000)
    fp32 = quantstudy.load_engine(study.folder, Engine.FP32)
    assert not fp32.info.fp8_real and fp32(images).dtype == torch.float32


def _copy(study, tmp_path: Path, edit) -> Path:
    """The study's folder copied, its record edited by `edit(data)` and sealed again."""
    folder = tmp_path / "copy"
    shutil.copytree(study.folder, folder, ignore=shutil.ignore_patterns(".cache", ".lock"))
    data = json.loads((folder / "study.json").read_text())
    edit(data)
    data["digest"] = record_digest(data)
    (folder / "study.json").write_text(json.dumps(data))
    return folder


def _partial(data: dict) -> None:
    data.update(status="partial", engines=[], quality=None, decision=None)


def _newer(data: dict) -> None:
    data["schema_version"] = 999


def _timed_on_h100(data: dict) -> None:
    data["environment"]["gpu_name"] = "NVIDIA H100 80GB HBM3"
    fp8 = next(e for e in data["engines"] if e["name"] == "fp8")
    layer = fp8["fp8_real"][0]
    fp8["fp8_kernel_choice"] = [
        {"name": layer, "kernel": "fused", "fused_us": 3.0, "scaled_mm_us": 4.0, "batch": b}
        for b in (1, 2)
    ]
    data["config"]["fp8_kernel"] = "fastest"


@pytest.mark.parametrize(
    "edit, message",
    [
        (_partial, "has no fp8 engine to load (status partial); load the engine of a study"),
        (_newer, "has schema_version 999; this quantstudy reads versions"),
        (_timed_on_h100, "by timing it on NVIDIA H100 80GB HBM3 (--fp8-kernel fastest); here"),
    ],
)
def test_load_engine_refuses_what_it_cannot_rebuild_faithfully(
    study, tmp_path, edit, message
) -> None:
    folder = _copy(study, tmp_path, edit)
    with pytest.raises(quantstudy.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quantstudy.load_engine(folder)


def test_load_engine_and_load_study_refuse_a_folder_without_a_record(tmp_path, study) -> None:
    for call in (quantstudy.load_engine, quantstudy.load_study):
        with pytest.raises(quantstudy.UserError, match=r"no study record at .*study\.json"):
            call(tmp_path)
    with pytest.raises(quantstudy.UserError, match="engine 'int8': load_engine rebuilds one of"):
        quantstudy.load_engine(study.folder, "int8")
