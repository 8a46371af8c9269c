"""`prepare_study`: everything a study measures from, read and calibrated once.

A study, a search, a benchmark and a data test all start from the same preparation, so they
measure the same model, images and FP8 plan:

    prepared = prepare_study(StudyConfig(model="tf_efficientnet_lite0", data=..., ...))
    prepared.model, prepared.heldout_x, prepared.labels, prepared.plan

1. Inputs (`inputs.py`): model and weights, preprocessing, the scanned and split images, the
   recipe and its resolution against the model, the policy; every user mistake fails here,
   before any image is decoded.
2. Images: the calibration tensor, decoded once. The held-out images are decoded only when a
   caller reads `heldout_x` (a search, a benchmark); a study streams them instead
   (`study/heldout.py`), so their number does not set its memory.
3. Calibration, part of preparation because every FP8 engine needs its scales: for random
   weights the BatchNorm statistics are re-estimated on the calibration images first (keeps fp16
   activations finite), then the recipe's calibrator sets each selected layer's input scale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from quantstudy.data.images import load_images
from quantstudy.engines.host_memory import keep_freed_memory
from quantstudy.env.machine import device_label, gpu_capability, gpu_name, torch_version
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.preprocess import build_transform
from quantstudy.quant.calibration.calibrate import stats_source
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.schema import Recipe
from quantstudy.record import CalibrationInfo, ModelInfo, Preprocessing, RecipeInfo, StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.study.calib_stats import SharedStats, shared_stats
from quantstudy.study.inputs import StudyInputs, prepare_inputs

FP8_CAPABILITY = (8, 9)  # Ada and newer: FP8 tensor cores (cuBLASLt FP8, Triton fp8 dot)

StageHook = Callable[[str], AbstractContextManager[object]]
"""Wraps each preparation stage ("load", "images", "calibrate"), e.g. a timer's `stage`."""


def _no_stage(_name: str) -> AbstractContextManager[object]:
    return nullcontext()


@dataclass(frozen=True)
class Prepared:
    """One study's inputs, images and calibrated FP8 plan; the model stays on the CPU."""

    config: StudyConfig
    device: torch.device
    inputs: StudyInputs  # model, preprocessing, split, data summary, recipe, resolution, policy
    calib_x: torch.Tensor  # float32 NCHW, preprocessed
    plan: QuantPlan
    calibration: CalibrationInfo  # the plan's scales as the record holds them
    model_info: ModelInfo  # the loaded model's, saying when BatchNorm was re-estimated

    @property
    def model(self) -> nn.Module:
        """The float32 model the engines are built from (BatchNorm re-estimated for random
        weights)."""
        return self.inputs.loaded.model

    @cached_property
    def _heldout(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        transform = build_transform(self.inputs.pre)
        return load_images(self.inputs.heldout_items, transform, desc="held-out images")

    @property
    def heldout_x(self) -> torch.Tensor:
        """The held-out images, float32 NCHW, decoded on first use and kept."""
        return self._heldout[0]

    @property
    def labels(self) -> torch.Tensor | None:
        """The held-out labels (int64), None when the held-out images are unlabelled."""
        if not all(item.label is not None for item in self.inputs.heldout_items):
            return None
        return torch.tensor([item.label for item in self.inputs.heldout_items], dtype=torch.int64)

    @property
    def pre(self) -> Preprocessing:
        return self.inputs.pre

    @property
    def recipe(self) -> Recipe:
        return self.inputs.recipe

    @property
    def layers(self) -> list[str]:
        """The recipe's selected layers, in resolution order."""
        return self.plan.layers

    @property
    def example(self) -> torch.Tensor:
        """A zero image of the model's input size, for passes that need only shapes."""
        return self.inputs.example


def prepare_study(
    config: StudyConfig, stage: StageHook = _no_stage, inputs: StudyInputs | None = None
) -> Prepared:
    """Check and read everything `config` names, decode its images, calibrate its FP8 plan.

    Raises `UserError` for any user mistake (model, folders, recipe, policy, device) before
    decoding an image. `stage` wraps the three stages (for timings). `inputs`: what
    `prepare_inputs(config)` already read, for a caller that acts on them before the images are
    decoded (`run_study` writes its first partial record)."""
    device = study_device(config.device)
    if inputs is None:
        with stage("load"):
            inputs = prepare_inputs(config)
    transform = build_transform(inputs.pre)
    with stage("images"):
        calib_x, _ = load_images(inputs.calib_items, transform, desc="calibration images")
    with stage("calibrate"):
        plan, model_info = _calibrate(config, inputs, calib_x, device)
    return Prepared(
        config=config,
        device=device,
        inputs=inputs,
        calib_x=calib_x,
        plan=plan,
        calibration=plan.calibration.info(with_means=plan.bias_correction),
        model_info=model_info,
    )


def _calibrate(
    config: StudyConfig, inputs: StudyInputs, calib_x: torch.Tensor, device: torch.device
) -> tuple[QuantPlan, ModelInfo]:
    """Activation scales from the fp32 model (BatchNorm re-estimated first for random weights)."""
    model = inputs.loaded.model.to(device)
    info = inputs.loaded.info
    if info.random_weights:
        n_bn = reestimate_batchnorm(model, batches(calib_x, config.eval_batch, device))
        detail = (
            f"{info.weights_detail}; BatchNorm statistics of {n_bn} layers re-estimated on the "
            f"{calib_x.shape[0]} calibration images (keeps fp16 activations finite)"
        )
        info = info.model_copy(update={"weights_detail": detail})
    with stats_source(_shared_stats(config, inputs, device)):
        plan = calibrated_plan(
            model,
            inputs.recipe,
            inputs.recipe_info,
            lambda: batches(calib_x, config.eval_batch, device),
            inputs.example,
        )
    model.cpu()
    return plan, info


def calibrated_plan(
    model: nn.Module,
    recipe: Recipe,
    info: RecipeInfo,
    calibration: Callable[[], Iterable[torch.Tensor]],
    example: torch.Tensor,
) -> QuantPlan:
    """The FP8 plan of `recipe` (resolved against `model` as `info`): the fp32 `model`
    calibrated over `calibration()` (on the device its batches are on), then the recipe's
    fitting options. A study and `quantstudy.quantize` plan through here."""
    layers = [d.name for d in info.selected]
    return build_plan(model, layers, calibration, example, quant_options(recipe))


def _shared_stats(
    config: StudyConfig, inputs: StudyInputs, device: torch.device
) -> SharedStats | None:
    """The host's shared calibration statistics for this study's fp32 inputs (`calib_stats.py`:
    everything that decides them is in the key), or None when sharing is off."""
    info = inputs.loaded.info
    folder = config.calib_data or config.data
    gpu = device_label(device)
    return shared_stats(
        [
            config.model,
            info.weights_sha256,
            info.random_weights,  # BatchNorm re-estimated on the calibration images
            inputs.pre.model_dump(mode="json"),
            str(Path(folder).resolve()) if folder else None,
            inputs.data.calibration.ids_sha256,
            config.eval_batch,
            gpu,
            torch_version(),
        ]
    )


def study_device(name: str) -> torch.device:
    """The device of `--device`, refused with a clear message where it cannot run FP8. On the CPU
    every pass runs on host tensors of tens of MiB: the process keeps the memory they free
    rather than mapping fresh pages for each (why: `engines/host_memory.py`)."""
    if name == "cpu":
        keep_freed_memory()
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda asked for, but PyTorch sees no CUDA GPU here. Run with --device cpu "
            "(quality only; timings are then marked not meaningful) or on a machine with a GPU"
        )
    if name == "cuda":
        cuda = torch.device(name)
        major, minor = gpu_capability(cuda)
        if (major, minor) < FP8_CAPABILITY:
            raise UserError(
                f"{gpu_name(cuda)} (compute capability {major}.{minor}) has no FP8 "
                "tensor cores: FP8 matrix products need compute capability 8.9 or newer (Ada, "
                "Hopper, Blackwell). Run with --device cpu for quality only"
            )
    return torch.device(name)


def batches(x: torch.Tensor, size: int, device: torch.device) -> Iterator[torch.Tensor]:
    """`x` in slices of `size` images, each moved to `device` as it is taken."""
    return (x[i : i + size].to(device) for i in range(0, x.shape[0], size))
