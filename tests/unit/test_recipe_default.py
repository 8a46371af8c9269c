"""The recipe a model gets without `--recipe`: its family's, else `generic_default`, which chooses
FP8 layers from what the model holds; a recipe that selects nothing names those that would."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from quantstudy.recipe.builtin import (
    FALLBACK_RECIPE,
    FAMILY_RECIPES,
    default_choice,
    default_recipe_for,
    load_recipe,
)
from quantstudy.recipe.choose import alternatives, nothing_selected
from quantstudy.recipe.family import SPLITS, family_of, split_of, timm_module
from quantstudy.recipe.resolve import resolve
from quantstudy.recipe.schema import parse_recipe
from quantstudy.recipe.show import format_resolution
from quantstudy.record.errors import UserError
from quantstudy.study.checks import require_selection

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("ghostnetv2_100", "ghostnet_pointwise"),  # fell through `ghostnet_*` before
        ("ghostnetv3_050", "ghostnet_pointwise"),
        ("xception65.tf_in1k", "xception_pointwise"),
        ("xception71", "xception_pointwise"),
        ("legacy_xception", FALLBACK_RECIPE),  # another network, not the aligned family
        ("res2next50", "res2net_all_after_stem"),
        ("tf_efficientnet_b0", "generic_pointwise"),
        ("resnet50", FALLBACK_RECIPE),
        ("vit_tiny_patch16_224.augreg_in21k_ft_in1k", FALLBACK_RECIPE),
    ],
)
def test_default_recipe_for_variants(model_name: str, expected: str) -> None:
    assert default_recipe_for(model_name) == expected


def _families() -> dict[str, list[str]]:
    """Every architecture timm ships, by family."""
    found: dict[str, list[str]] = {}
    for name in timm.list_models():
        found.setdefault(family_of(name), []).append(name)
    return found


def test_a_family_recipe_covers_every_variant_timm_ships_of_its_family() -> None:
    """A family is a timm module or a split of one (recipe/family.py), so every model of the
    module gets the family's recipe; MobileNetV4 is split from mobilenetv3.py, whose other
    networks keep the generic default."""
    families = _families()
    for family, recipe in FAMILY_RECIPES.items():
        models = families.get(family, [])
        assert models, f"timm ships no model of the family {family}"
        assert [m for m in models if default_recipe_for(m) != recipe] == []
    assert default_recipe_for("mobilenetv3_large_100") == FALLBACK_RECIPE
    assert family_of("mobilenetv3_large_100") == "mobilenetv3"
    assert family_of("mobilenetv4_conv_small.e2400_r224_in1k") == "mobilenetv4"


def test_every_split_is_used_and_names_no_module() -> None:
    """A split's glob matches some model timm ships (a dead glob is a typo), and a split's name
    is no timm module's, or one word would name two families."""
    shipped = timm.list_models()
    modules = {timm_module(m) for m in shipped}
    for split in SPLITS:
        assert any(split_of(m) == split for m in shipped), split.family
        assert split.family not in modules, split.family


def test_the_family_of_the_zoo_s_models() -> None:
    assert family_of("vit_tiny_patch16_224.augreg_in21k") == "vision_transformer"
    assert family_of("timm/xception41.tf_in1k") == "xception_aligned"
    assert family_of("legacy_xception") == "xception"  # another network, another module
    assert family_of("mobilenetv2_100") == "efficientnet"
    assert family_of("not_a_timm_model.tag") == "not_a_timm_model"


def test_the_fallback_names_the_family_it_did_not_recognise() -> None:
    choice = default_choice("vit_tiny_patch16_224.augreg_in21k")
    assert not choice.by_family and choice.recipe == FALLBACK_RECIPE
    line = choice.describe()
    assert "no family recipe for vit_tiny_patch16_224 (family vision_transformer)" in line
    assert "ghostnet" in line
    family = default_choice("ghostnetv2_100").describe()
    assert family.startswith("ghostnet_pointwise, the recipe of the ghostnet family")
    assert timm_module("not_a_timm_model") is None


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.proj(torch.softmax(q @ k.transpose(1, 2), -1) @ v)
        return x + self.fc2(torch.relu(self.fc1(x)))


class _TinyViT(nn.Module):
    """Patch embedding, one block, a pre-logits linear on the pooled vector, a classifier, and
    a linear the model computes with through its weight (never called)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 4, stride=4)
        self.block = _Block(16)
        self.pre_logits = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)
        self.unused = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.patch(x).flatten(2).transpose(1, 2))
        x = nn.functional.linear(x, self.unused.weight)  # as beit's qkv with its own bias
        return self.head(torch.tanh(self.pre_logits(x.mean(1))))


def _tiny_cnn() -> nn.Module:
    """A stem and 3x3 convs with a strided 1x1 shortcut-like conv: nothing the default takes."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.Conv2d(16, 32, 1, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def _default(model: nn.Module, size: int = 16):
    recipe, _ = load_recipe(FALLBACK_RECIPE)
    return resolve(recipe, model, torch.randn(1, 3, size, size))


def test_default_takes_the_block_linears_and_says_why_for_the_rest() -> None:
    torch.manual_seed(0)
    res = _default(_TinyViT())
    assert res.selected_names == ["block.qkv", "block.proj", "block.fc1", "block.fc2"]
    why = {d.name: d.reason for d in res.excluded}
    assert why["patch"].startswith("stem or patch embedding")
    assert why["pre_logits"].startswith("layer on a pooled 1x1 map")
    assert why["head"].startswith("classifier")
    assert why["unused"].startswith("not called as a module")
    assert res.notes == []  # rules that a ViT leaves unused are optional in a generic recipe


def test_default_leaves_kxk_and_strided_1x1_convs_with_their_reason() -> None:
    res = _default(_tiny_cnn())
    assert res.selected == []
    why = {d.name: d.reason for d in res.excluded}
    assert why["0"].startswith("stem") and why["1"].startswith("dense kxk conv")
    assert "x 0.75" in why["1"] and why["2"].startswith("strided 1x1 conv")


def test_a_recipe_that_selects_nothing_names_those_that_do() -> None:
    res = _default(_tiny_cnn())
    found = alternatives(res.candidates, without=FALLBACK_RECIPE)
    names = [a.name for a in found]
    assert names[0] == "generic_dense_convs" and names[-1] == "generic_all"
    assert all(a.selected > 0 for a in found)
    with pytest.raises(UserError) as err:
        require_selection(res, f"builtin:{FALLBACK_RECIPE}", "toy")
    message = str(err.value)
    assert "\n" not in message
    assert "generic_dense_convs (2 layers)" in message and "--recipe NAME" in message
    assert f"recipes show {FALLBACK_RECIPE} --model toy" in message


def test_a_model_without_candidates_gets_no_alternative() -> None:
    """generic_all selects every conv and linear, so only a model with none has no recipe."""
    res = resolve(parse_recipe(b"name: x\nrules:\n  - include: {op: linear}\n", "x"),
                  nn.Sequential(nn.ReLU()), torch.randn(1, 3, 8, 8))  # fmt: skip
    assert alternatives(res.candidates) == []
    assert nothing_selected(res, "x").startswith("no built-in recipe selects a layer of it")


def test_show_labels_linears_by_what_they_are() -> None:
    """generic_pointwise leaves linears out: an attention linear is a linear layer, only the
    last one run is the classifier."""
    torch.manual_seed(0)
    recipe, _ = load_recipe("generic_pointwise")
    res = resolve(recipe, _TinyViT(), torch.randn(1, 3, 16, 16))
    why = {d.name: d.reason for d in res.excluded}
    assert why["block.qkv"] == "linear layer; not in the pointwise recipe"
    assert why["head"].startswith("classifier")
    text = format_resolution(res, "generic_pointwise", "toy", as_json=False)
    assert "it selects no layer: built-in recipes that select layers of it" in text
