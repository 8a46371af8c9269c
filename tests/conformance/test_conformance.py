"""Conformance: `quantstudy run NAME` without `--recipe` on small timm models of many families.

The README answers "does FP8 pay for this timm image classifier?"; this tier holds what that
promise covers. MODELS is the smallest variant of 32 families (31 timm modules: timm keeps one
family per module, MobileNetV3 and V4 share one), random weights, CPU, seed 0. Each either
completes with at least one real FP8 layer under the recipe it gets by default (its family's,
else `generic_default`), or is refused in one line that names built-in recipes that select
layers of it, and then the first one named completes.

What "completes" is tested through (a whole study adds the fake-quant engines and the stress
and held-out passes: dla34's took 9 s alone on two cores where this path took 1.2 s, and the tier
has five minutes): the study's own path to the FP8 engine's logits, in
process, with the library functions a study calls: the model built (`load_model`, random
weights), the default chosen (`default_choice`) and resolved at the model's input size, the
study's refusal check (`require_selection`), BatchNorm re-estimated and activations
calibrated on 2 images (`build_plan`), the FP8 engine built on the CPU with every engine
rewrite (absorbed activations, FP8 hand-offs, residual sums, padded outputs; `build_fp8`), and
its logits on those images: one finite row per image, at least one real FP8 layer, and every
FP8 module answering the replaced layer's attributes (`quant/layers/dropin.py`). A handful of
whole studies run through the CLI (`quantstudy run NAME --weights random --device cpu
--no-speed --calib 4 --heldout 8` on 12 tiny synthetic images): they end with a decision
(inconclusive, exit 4: CPU timings are no speed evidence) or with the one-line refusal (exit 1).

Not tested here: speed (CPU timings mean nothing), quality (random weights), the GPU kernels
(tests/gpu run them), and models over about 2 GMACs (their families' smallest variants are
here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from quantstudy import cli
from quantstudy.engines.builders import build_fp8
from quantstudy.engines.run import device_logits
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.layers.dropin import CONV_ATTRS, LINEAR_ATTRS, DropIn
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.builtin import default_choice, load_recipe
from quantstudy.recipe.choose import alternatives
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.resolve import Resolution, resolve
from quantstudy.record.errors import EXIT_NOTHING_SELECTED, UserError
from quantstudy.study.checks import require_selection
from tests.unit._tiny_data import write_tiny_imagenet

# (model, the recipe the default's refusal names first; None: the default completes).
# Measured alone on 2 cores: the tier takes about 1.5 minutes, maxvit's 157 FP8 layers a fifth.
MODELS: list[tuple[str, str | None]] = [
    ("resnet18", "generic_dense_convs"),  # 3x3 convs and strided 1x1 shortcuts only
    ("vit_tiny_patch16_224", None),
    ("deit_tiny_patch16_224", None),
    ("swin_tiny_patch4_window7_224", None),
    ("levit_128s", None),
    ("edgenext_xx_small", None),  # PositionalEncodingFourier reads token_projection.weight
    ("xcit_nano_12_p16_224", None),  # the same positional encoding
    ("convit_tiny", None),  # reads qk.weight.device and .dtype
    ("dla34", None),  # DlaTree does not run as traced: the residual rewrite is skipped
    ("ghostnetv2_100", None),  # ghostnet's family recipe
    ("mobilenetv3_small_050", None),
    ("mobilenetv4_conv_small", None),  # MobileNetV4's family recipe
    ("efficientnet_b0", None),  # EfficientNet's family recipe (generic_pointwise)
    ("crossvit_tiny_240", None),  # CrossViT's family recipe
    ("convnext_atto", None),
    ("regnety_002", None),
    ("efficientvit_b0", None),
    ("maxvit_rmlp_pico_rw_256", None),
    ("mixer_s32_224", None),
    ("poolformer_s12", None),
    ("pvt_v2_b0", None),
    ("cait_xxs24_224", None),
    ("fastvit_t8", None),
    ("hrnet_w18_small", None),
    ("efficientvit_m0", None),  # efficientvit_msra, another network than efficientvit_b0
    ("tiny_vit_5m_224", None),
    ("efficientformer_l1", None),
    ("hgnetv2_b0", None),
    ("starnet_s1", None),
    ("inception_next_atto", None),
    ("rexnet_100", None),
    ("ese_vovnet19b_slim", None),
]
CALIB_IMAGES = 2


def _default_or_named(name: str, model: nn.Module, example: torch.Tensor, refusal: str | None):
    """The default recipe's resolution, or, where the study refuses it, the first recipe its
    one-line refusal names (which must be `refusal`)."""
    choice = default_choice(name)
    recipe, source = load_recipe(choice.recipe)
    res = resolve(recipe, model, example)
    if refusal is None:
        require_selection(res, source, name)  # must not refuse
        return recipe, res
    with pytest.raises(UserError) as err:
        require_selection(res, source, name)
    message = str(err.value)
    assert "\n" not in message and f"{refusal} (" in message, message
    assert alternatives(res.candidates, without=choice.recipe)[0].name == refusal
    recipe, _ = load_recipe(refusal)
    return recipe, resolve(recipe, model, example)


def _check_face(engine_model: nn.Module, source: nn.Module, res: Resolution) -> None:
    """Every FP8 module answers what the layer it replaced answers (`quant/layers/dropin.py`)."""
    for name in res.selected_names:
        fp8, layer = engine_model.get_submodule(name), source.get_submodule(name)
        assert isinstance(fp8, DropIn), (name, type(fp8))
        assert fp8.weight.shape == layer.weight.shape, name
        names = LINEAR_ATTRS if isinstance(layer, nn.Linear) else CONV_ATTRS
        assert all(getattr(fp8, a) == getattr(layer, a) for a in names), name


@pytest.mark.parametrize(("name", "refusal"), MODELS, ids=[m for m, _ in MODELS])
def test_default_recipe_completes_or_names_one_that_does(name: str, refusal: str | None) -> None:
    loaded = load_model(name, "random", seed=0)
    model = loaded.model
    size = resolve_preprocessing(model).input_size
    example = torch.zeros(1, *size)
    recipe, res = _default_or_named(name, model, example, refusal)
    assert res.selected, f"{recipe.name} selects no layer of {name}"
    images = torch.randn(CALIB_IMAGES, *size, generator=torch.Generator().manual_seed(0))
    reestimate_batchnorm(model, [images])  # as a study does for random weights
    layers = res.selected_names
    plan = build_plan(model, layers, lambda: [images], example, quant_options(recipe))
    engine = build_fp8(model, torch.device("cpu"), example, plan)
    logits = device_logits(engine, images)
    assert logits.shape == (CALIB_IMAGES, loaded.info.num_classes)
    assert bool(torch.isfinite(logits).all()), f"{name}: non-finite FP8 logits"
    info = engine.info()
    assert info.fp8_real, f"{name}: no real FP8 layer ({info.fp8_emulated})"
    _check_face(engine.eager, model, res)
    if name == "dla34":  # skipped and said why, never a crash
        assert "TypeError" in info.layout.rewrites_skipped["residual"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_imagenet(tmp_path_factory.mktemp("conformance") / "images", seed=0)


def _run(model: str, data: Path, out: Path) -> int:
    argv = ["run", model, "--weights", "random", "--device", "cpu", "--no-speed"]
    return cli.main(
        [*argv, "--calib", "4", "--heldout", "8", "--data", str(data), "--out", str(out)]
    )


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "edgenext_xx_small", "dla34"])
def test_whole_study_through_the_cli(name: str, tiny_data: Path, tmp_path: Path) -> None:
    """A study that reaches its decision: inconclusive on the CPU (no speed evidence), with
    real FP8 layers in the record (a ViT's block linears, edgenext's drop-in layers), and
    dla34's skipped residual rewrite said there."""
    assert _run(name, tiny_data, tmp_path / name) == 4
    record = json.loads((tmp_path / name / "study.json").read_text())
    fp8 = next(e for e in record["engines"] if e["name"] == "fp8")
    assert fp8["fp8_real"] and record["decision"]["outcome"] == "inconclusive"
    if name == "dla34":
        assert "residual" in fp8["fp8_rewrites_skipped"]
        assert "Rewrite `residual` not applied" in (tmp_path / name / "report.md").read_text()


def test_refusal_through_the_cli_names_a_recipe(tiny_data: Path, tmp_path: Path, capsys) -> None:
    assert _run("resnet18", tiny_data, tmp_path / "resnet18") == EXIT_NOTHING_SELECTED
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("quantstudy: error: recipe builtin:generic_")
    assert "generic_dense_convs (19 layers)" in errors[0]
