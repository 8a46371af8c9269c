"""The Python API without a study: the package root (cheap import, what it exports), `quantize`
on each form of calibration, its plan, and its refusals in the command line's words."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import timm
import torch
from torch import nn

import quantstudy
from quantstudy.record import StudyConfig

torch.set_num_threads(1)


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, quantstudy; quantstudy.StudyConfig; quantstudy.load_study; "
        "print(sorted(m for m in ('torch', 'timm', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_lists_what_the_root_exports_and_nothing_else() -> None:
    for name in quantstudy.__all__:
        assert getattr(quantstudy, name) is not None
    assert dir(quantstudy) == sorted(quantstudy.__all__)
    with pytest.raises(AttributeError):
        quantstudy.build_fp8  # noqa: B018  (internal: not exported)


def test_every_public_call_has_an_example() -> None:
    for name in ("quantize", "load_engine", "run_study", "load_study", "Study", "EngineModule"):
        assert "Example::" in (getattr(quantstudy, name).__doc__ or ""), name


def test_quantize_takes_the_study_options_defaults() -> None:
    """Same names and defaults as the command line's, which come from StudyConfig's fields."""
    params = inspect.signature(quantstudy.quantize).parameters
    options = [n for n in params if n not in ("model", "recipe", "calibration")]
    assert options
    for name in options:
        assert params[name].default == StudyConfig.model_fields[name].default, name


@pytest.fixture(scope="module")
def vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("test_vit")


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(4, 3, 160, 160, generator=torch.Generator().manual_seed(1))


def test_every_form_of_calibration_gives_the_same_model(vit, images) -> None:
    """A tensor, an iterable of (images, labels) pairs and a forward loop feeding the same
    batch calibrate the same scales, so the FP8 models compute the same logits."""
    fp8, plan = quantstudy.quantize(vit, calibration=images, device="cpu")
    logits = fp8(images)
    assert logits.shape == (4, 1000) and torch.isfinite(logits).all()
    pairs = [(images, torch.zeros(4, dtype=torch.int64))]
    for calibration in (pairs, lambda model: model(images)):
        other, other_plan = quantstudy.quantize(vit, calibration=calibration, device="cpu")
        assert other_plan.calibration == plan.calibration
        assert torch.equal(other(images), logits)


def test_the_plan_says_which_layer_is_fp8_with_which_scale_and_why(vit, images) -> None:
    _, plan = quantstudy.quantize(vit, "generic_linears", calibration=images, device="cpu")
    rows = {name: (kind, scale, why) for name, kind, scale, why in plan.table()}
    kind, scale, why = rows["blocks.0.mlp.fc1"]
    assert kind == "fp8" and scale is not None and scale > 0 and why
    assert rows["patch_embed.proj"][0] == "float" and rows["patch_embed.proj"][1] is None
    assert plan.recipe.name == "generic_linears" and plan.spec.kernel == "fused"
    assert plan.scale("blocks.0.mlp.fc1") == scale


def test_the_model_is_left_as_it_was(vit, images) -> None:
    vit.train()
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    quantstudy.quantize(vit, calibration=images, device="cpu")
    assert vit.training
    assert all(torch.equal(before[k], v) for k, v in vit.state_dict().items())
    vit.eval()


@pytest.mark.parametrize(
    "model, message",
    [
        ("test_vit", "quantize takes a timm classifier (an nn.Module from timm.create_model), "),
        (nn.Sequential(nn.Linear(3, 3)), "Sequential has no timm pretrained_cfg"),
    ],
)
def test_quantize_refuses_what_is_not_a_timm_classifier(model, message, images) -> None:
    with pytest.raises(quantstudy.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quantstudy.quantize(model, calibration=images, device="cpu")


@pytest.mark.parametrize(
    "calibration, message",
    [
        ([], "calibration set is empty: give at least one calibration image"),
        (iter([]), "calibration set is empty"),
        (lambda model: None, "calibration set is empty"),
        (torch.randn(2, 3, 224, 224), r"calibration tensor is a float32 tensor of shape \(2, 3, "),
        ([torch.randn(1, 3, 160, 160), torch.randn(160, 160)], "calibration batch 1 is a "),
        (torch.zeros(2, 3, 160, 160, dtype=torch.uint8), "take float images of shape"),
        (3, "calibration is a int: give a folder of images, a tensor"),
        ("/nonexistent/images", "data folder /nonexistent/images does not exist"),
    ],
)
def test_quantize_refuses_calibration_that_yields_nothing_or_the_wrong_shape(
    vit, calibration, message
) -> None:
    with pytest.raises(quantstudy.UserError, match=message.replace("take float", "takes float")):
        quantstudy.quantize(vit, calibration=calibration, device="cpu")


def test_quantize_refuses_a_bad_option_as_the_command_line_does(vit, images) -> None:
    for option in ({"eval_batch": 0}, {"batches": (2, 2)}, {"compile_mode": "fast"}):
        with pytest.raises(quantstudy.UserError) as api:
            quantstudy.quantize(vit, calibration=images, device="cpu", **option)
        with pytest.raises(quantstudy.UserError) as cli:
            StudyConfig(model="test_vit", data=".", **option)
        assert str(api.value) == str(cli.value)
    assert str(api.value).startswith("--compile-mode must be")
    with pytest.raises(quantstudy.UserError, match="unknown recipe 'no_such_recipe'"):
        quantstudy.quantize(vit, "no_such_recipe", calibration=images, device="cpu")
