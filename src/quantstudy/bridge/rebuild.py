"""The study's model and recipe rebuilt from its record alone: what the export and its check need.

A study records everything that decides its FP8 arithmetic: the model name and weights, the
resolved layers, weight granularity, BatchNorm folding, bias correction and every calibrated
activation scale (with its consumers). Rebuilding from those, rather than calibrating again, is
what makes the exported ONNX the study's recipe and not a new one. Only random-weight studies
need images beyond the held-out set: their BatchNorm statistics were re-estimated on the
calibration images, which the rebuild repeats in the same batches.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from quantstudy.data.folders import ImageItem
from quantstudy.data.images import load_images
from quantstudy.data.split import ids_sha256
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform
from quantstudy.quant.calibration.calibrate import Calibration
from quantstudy.quant.fitting.bias_correction import correct_biases
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.rewrites.fold import fold_batchnorm
from quantstudy.record import CalibrationInfo, ImageSet, RecipeInfo, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import GeluPolicy
from quantstudy.study.inputs import split_study_data
from quantstudy.study.per_image import set_ids

DEFAULT_EVAL_BATCH = 64  # the study's quality batch before records stored it (schema 6)


@dataclass(frozen=True)
class Rebuilt:
    """The study's fp32 model (as calibrated), its quantization plan and the deployed float
    model: BatchNorm folded as the study folded it, biases corrected when the recipe corrects."""

    record: StudyRecord
    model: nn.Module
    plan: QuantPlan
    deployed: nn.Module
    fold_bn: bool

    @property
    def example(self) -> torch.Tensor:
        return torch.zeros(1, *self.record.preprocessing.input_size)


def recipe_and_calibration(record: StudyRecord) -> tuple[RecipeInfo, CalibrationInfo]:
    """The record's recipe and calibration sections, which a study that stopped before
    calibration lacks."""
    if record.calibration is None or record.recipe is None:
        raise UserError(
            f"study {record.name} has no recipe or calibration section (status {record.status}); "
            "export needs a study that got past calibration"
        )
    return record.recipe, record.calibration


def calibration_of(record: StudyRecord) -> Calibration:
    """The record's calibration as the quantizers use it: one scale per shared input tensor."""
    _, info = recipe_and_calibration(record)
    groups, amax, means = {}, {}, {}
    for t in info.tensors:
        key = t.tensor.removesuffix(":input")
        groups[key] = list(t.consumers)
        amax[key] = t.amax
        if t.channel_mean is not None:
            for layer in t.consumers:
                means[layer] = torch.tensor(t.channel_mean, dtype=torch.float32)
    return Calibration(
        calibrator=info.calibrator,
        params=dict(info.params),
        n_images=info.n_images,
        groups=groups,
        amax=amax,
        channel_mean=means,
    )


# Recipe options the export writes as Q/DQ: field -> the one value it supports. Later options
# (compensating weight rounding, dynamic per-row activation scales, scale migration) change what
# the engines compute in ways a per-tensor Q/DQ pair does not express; weights and biases set
# by the propagated fit or tuned depend on the calibration images, which the record does not hold.
SUPPORTED = {
    "rounding": "nearest",
    "scale_candidates": 1,
    "refine_sweeps": 0,
    "activation_granularity": "per_tensor",
    "migration": "none",
    "propagated": False,
    "tune": "none",
}


def plan_of(record: StudyRecord) -> QuantPlan:
    calibration = calibration_of(record)
    recipe, _ = recipe_and_calibration(record)
    for option, supported in SUPPORTED.items():
        value = getattr(recipe, option, supported)
        if value != supported:
            raise UserError(
                f"study {record.name}: its recipe's {option} is {value}; its engines are rebuilt "
                "from its record (export, package, load_engine), which holds static per-tensor "
                f"FP8 scales, not what {value} computed from the images: only {option} "
                f"{supported} rebuilds"
            )
    layers = [d.name for d in recipe.selected]
    missing = [n for n in layers if not any(n in c for c in calibration.groups.values())]
    if missing:
        raise UserError(
            f"study {record.name}: selected layers without a calibrated scale: {missing[:3]}; "
            "the record is incomplete, run the study again"
        )
    if recipe.bias_correction and not calibration.channel_mean:
        raise UserError(
            f"study {record.name} corrects biases but its record holds no channel means; run "
            "the study again with this quantstudy"
        )
    return QuantPlan(
        layers,
        recipe.weight_granularity == "per_channel",
        calibration,
        recipe.bias_correction,
        gelu=GeluPolicy(recipe.gelu),
    )


def rebuild(
    record: StudyRecord,
    data_dir: Path | None = None,
    calib_dir: Path | None = None,
    weights: Path | None = None,
) -> Rebuilt:
    """Load the study's model as the study did and rebuild its plan and deployed float model;
    `weights` replaces the recorded checkpoint path (a moved file, checked by its sha256)."""
    config = record.config
    recorded = str(config.weights)
    moved = record.model.weights == "file" and not Path(recorded).expanduser().is_file()
    if weights is None and moved:
        raise UserError(
            f"the study's checkpoint {recorded} is not there any more; pass it with "
            "`quantstudy export --weights FILE` (checked against the sha256 the study recorded)"
        )
    loaded = load_model(
        config.model,
        str(weights) if weights is not None else config.weights,
        seed=config.seed,
        strip_prefix=getattr(config, "strip_prefix", None),
    )
    if record.model.weights_sha256 and loaded.info.weights_sha256 != record.model.weights_sha256:
        raise UserError(
            f"the weights {config.weights} load with sha256 {loaded.info.weights_sha256}, but "
            f"the study used {record.model.weights_sha256}; export from the same checkpoint"
        )
    model = loaded.model
    if record.model.random_weights:
        _reestimate(model, record, data_dir, calib_dir)
    plan = plan_of(record)
    fold_bn = recipe_and_calibration(record)[0].fold_bn
    deployed = copy.deepcopy(model).eval()
    example = torch.zeros(1, *record.preprocessing.input_size)
    if fold_bn:
        fold_batchnorm(deployed, example)
    if plan.bias_correction:
        correct_biases(deployed, plan.layers, plan.calibration, plan.per_channel)
    return Rebuilt(record, model, plan, deployed, fold_bn)


def eval_batch(record: StudyRecord) -> int:
    return getattr(record.config, "eval_batch", None) or DEFAULT_EVAL_BATCH


def load_set(
    study_dir: Path, record: StudyRecord, images: ImageSet, folder: Path | None
) -> tuple[torch.Tensor, list[str]]:
    """The images of one of the study's sets, found by their recorded ids (in the record or its
    per-image side file) under `folder` (default: the folder the study read), checked against
    the recorded id hash."""
    root = Path(folder) if folder is not None else Path(images.folder)
    if not root.is_dir():
        flag = "--data" if images.role == "heldout" else "--calib-data"
        raise UserError(
            f"the study's {images.role} images were read from {images.folder}, which is not a "
            f"folder here; pass the folder that holds them with {flag}"
        )
    ids = set_ids(study_dir, record, images)
    missing = [i for i in ids if not (root / i).is_file()]
    if missing:
        raise UserError(
            f"{len(missing)} of the study's {images.n_images} {images.role} images are not in "
            f"{root} (first: {missing[0]}); pass the folder the study read"
        )
    if ids_sha256(ids) != images.ids_sha256:
        raise UserError(
            f"the study's {images.role} image list does not match its recorded hash; the record "
            "was edited"
        )
    # Labels are not needed (agreement and KL compare engines), so no class list is read.
    items = [ImageItem(id=i, path=root / i, label=None, wnid=None) for i in ids]
    x, _ = load_images(items, build_transform(record.preprocessing), desc=f"{images.role} images")
    return x, ids


def _reestimate(
    model: nn.Module, record: StudyRecord, data_dir: Path | None, calib_dir: Path | None
) -> None:
    """Random weights: the study set BatchNorm statistics from its calibration images, in its
    split's order and batches (the running average weighs batches, so both matter)."""
    config = record.config
    data = Path(data_dir or config.data)
    calib = calib_dir or config.calib_data
    for folder, flag in ((data, "--data"), (calib, "--calib-data")):
        if folder is not None and not Path(folder).is_dir():
            raise UserError(
                f"random-weight study: its BatchNorm statistics came from its calibration "
                f"images, and {folder} is not a folder here; pass it with {flag}"
            )
    split = split_study_data(config.model_copy(update={"data": data, "calib_data": calib}))
    if sorted(i.id for i in split.calib_items) != record.data.calibration.ids:
        raise UserError(
            "the calibration images found here are not the ones the study used; pass the "
            "folders it read with --data and --calib-data"
        )
    x, _ = load_images(split.calib_items, build_transform(record.preprocessing), desc="calib")
    size = eval_batch(record)
    reestimate_batchnorm(model, (x[i : i + size] for i in range(0, x.shape[0], size)))
