"""The FP8 model from Python: `quantize(model, recipe=..., calibration=...)`.

The same steps, through the same functions, as a study's FP8 engine: the recipe chosen and
resolved against the model (`study/inputs.py: choose_recipe`), the fp32 model calibrated and
the recipe's fitting options applied (`study/prepare.py: calibrated_plan`), the engine built by
the study's own builder (`study/engines.py: study_builders`) under the build spec a study of
these options takes (`StudyConfig.build_spec`). So on the same model, recipe, calibration
images and options, `quantize`'s model computes the study's FP8 engine's logits, bit for bit
on the CPU (tests/unit/test_api_study.py).

The options are a study's, by the command line's names and defaults: they are validated as
`StudyConfig` fields (a bad value is the command line's one-line `UserError`), in a config of
the model's timm name whose data folder is never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from quantstudy.api.calibration import Calibration, calibration_batches
from quantstudy.api.engine import EngineModule
from quantstudy.record import CalibrationInfo, EngineInfo, FP8Layout, RecipeInfo, StudyConfig
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Engine

if TYPE_CHECKING:
    from quantstudy.recipe.schema import Recipe


@dataclass(frozen=True)
class FP8Plan:
    """Which layer is FP8, with which scale and why: the recipe's layer table (`recipe`: every
    candidate layer, selected or not, and the rule that decided), the calibrated activation
    scales (`calibration`), the engine as built (`engine`: real and emulated FP8 layers, their
    kernels and epilogues in `engine.layout`) and the build spec it was built under (`spec`).
    The same sections a study records (`study.json`: recipe, calibration, engines)."""

    recipe: RecipeInfo
    calibration: CalibrationInfo
    engine: EngineInfo
    spec: BuildSpec

    def scale(self, layer: str) -> float | None:
        """The FP8 scale of `layer`'s input (amax / 448), None for a layer kept in float."""
        return next((t.scale for t in self.calibration.tensors if layer in t.consumers), None)

    def table(self) -> list[tuple[str, str, float | None, str]]:
        """(layer, "fp8" | "fp8 emulated" | "fp16 (stepped aside)" | "float", input scale,
        why), one row per candidate layer in the recipe's order."""
        real, emulated = set(self.engine.fp8_real), set(self.engine.fp8_emulated)
        rows = []
        for d in [*self.recipe.selected, *self.recipe.excluded]:
            kind = "float"
            if d.name in real or d.name in emulated:
                kind = Engine.FP8 + (" emulated" if d.name in emulated else "")
            if d.name in self.engine.layout.stepped_aside:
                kind = "fp16 (stepped aside)"
            rows.append((d.name, kind, self.scale(d.name) if d.selected else None, d.reason))
        return rows


class Quantized(NamedTuple):
    """What `quantize` returns: the FP8 model and its plan (`model, plan = quantize(...)`)."""

    model: EngineModule
    plan: FP8Plan


def quantize(
    model: nn.Module,
    recipe: str | Path | Recipe | None = None,
    *,
    calibration: Calibration,
    device: str = "cuda",
    fp8_kernel: str | None = None,
    fp8_accumulate: str | None = None,
    compile_mode: str = "default",
    batches: tuple[int, ...] = (1, 32, 128),
    calib: int = 500,
    seed: int = 0,
    eval_batch: int = 64,
) -> Quantized:
    """The FP8 model of a timm classifier, and its plan (module docstring).

    Example::

        model = timm.create_model("test_vit")
        fp8, plan = quantstudy.quantize(model, calibration=images, device="cpu")
        logits = fp8(images)

    `recipe`: a built-in recipe's name, a recipe YAML file or a `Recipe`; None: the model's
    family default. `calibration`: a folder of images (the `calib` of them a study with
    `--calib-data FOLDER --seed SEED` takes), a tensor of preprocessed images, an iterable of
    such batches, or a function that runs the model on them (`forward_loop(model)`). The other
    options are the study's, with its names and defaults (`--device`, `--fp8-kernel`,
    `--fp8-accumulate`, `--compile-mode`, `--batches`: where "fastest" times each layer's kernel,
    `--eval-batch`: the calibration batch). The model is left as it was (its mode, its device);
    its weights are used as they are (a study re-estimates a random-weight model's BatchNorm
    first, `quantize` does not)."""
    from quantstudy.model.preprocess import resolve_preprocessing
    from quantstudy.study.engines import study_builders
    from quantstudy.study.inputs import choose_recipe
    from quantstudy.study.prepare import calibrated_plan, study_device

    name = _timm_name(model)
    options = StudyConfig(
        model=name,
        data=".",  # never read: the options only
        device=device,
        fp8_kernel=fp8_kernel,
        fp8_accumulate=fp8_accumulate,
        compile_mode=compile_mode,
        batches=batches,
        calib=calib,
        seed=seed,
        eval_batch=eval_batch,
    )
    where = study_device(options.device)
    pre = resolve_preprocessing(model)
    example = torch.zeros(1, *pre.input_size)
    chosen = choose_recipe(recipe, model, name, example)
    images = calibration_batches(
        calibration, model, pre, calib=calib, seed=seed, eval_batch=options.eval_batch
    )
    spec = options.build_spec()
    training = model.training
    was_on = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:  # calibrated on the device, built from the CPU, as a study does; then left as given
        model.eval().to(where)
        plan = calibrated_plan(
            model, chosen.recipe, chosen.info, lambda: (x.to(where) for x in images), example
        )
        model.cpu()
        fold = chosen.recipe.weights.fold_bn
        builders = study_builders(options, model, example, plan, fold, where, spec)
        fp8 = EngineModule(builders[Engine.FP8](FP8Layout()))
    finally:
        model.train(training).to(was_on)
    calibrated = plan.calibration.info(with_means=plan.bias_correction)
    return Quantized(fp8, FP8Plan(chosen.info, calibrated, fp8.info, spec))


def _timm_name(model: object) -> str:
    """The timm architecture of `model`; anything but a timm classifier is refused."""
    if not isinstance(model, nn.Module):
        raise UserError(
            f"quantize takes a timm classifier (an nn.Module from timm.create_model), not a "
            f"{type(model).__name__}"
        )
    cfg: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
    classifier = getattr(model, "get_classifier", None)
    if not cfg.get("architecture") or classifier is None or not getattr(model, "num_classes", 0):
        raise UserError(
            f"quantize takes a timm classifier (timm.create_model(...)): {type(model).__name__} "
            "has no timm pretrained_cfg, classifier or class count, which give its input size, "
            "preprocessing and default recipe"
        )
    return str(cfg["architecture"])
