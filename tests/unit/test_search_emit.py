"""The emitted recipe resolves to exactly the chosen layers."""

import pytest
import timm
import torch
from torch import nn

from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record.errors import UserError
from quantstudy.search.emit import recipe_text, write_recipe

torch.set_num_threads(1)


class Tricky(nn.Module):
    """Names where an unescaped dot would also match another layer: b1.x vs b1yx."""

    def __init__(self):
        super().__init__()
        self.b1 = nn.Module()
        self.b1.x = nn.Conv2d(3, 8, 1)
        self.b1yx = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.b1yx(self.b1.x(x)).mean((2, 3)))


def test_recipe_resolves_to_exactly_the_chosen_layers(tmp_path):
    model = Tricky().eval()
    example = torch.zeros(1, 3, 8, 8)
    base, _ = load_recipe("generic_all")
    path = tmp_path / "r.yaml"
    write_recipe(
        path,
        base,
        ["b1.x"],
        model,
        example,
        name="generic_all.searched",
        description="test",
        reasons={"b1.x": "chosen: saves 1 ms"},
        header=["a comment"],
    )
    recipe, source = load_recipe(str(path))
    assert source == str(path)
    resolution = resolve(recipe, model, example)
    assert resolution.selected_names == ["b1.x"]
    assert resolution.selected[0].reason == "chosen: saves 1 ms"
    assert recipe.variant_of == "generic_all"
    assert recipe.weights == base.weights and recipe.activations == base.activations
    assert path.read_text().startswith("# a comment\n")


def test_timm_model_subset(tmp_path):
    model = timm.create_model("mobilenetv4_conv_small", pretrained=False).eval()
    example = torch.zeros(1, 3, 64, 64)
    base, _ = load_recipe("mobilenetv4_pointwise")
    candidates = resolve(base, model, example).selected_names
    chosen = candidates[::3]
    path = tmp_path / "mnv4.yaml"
    write_recipe(path, base, chosen, model, example, name="mnv4.searched", description="d")
    recipe, _ = load_recipe(str(path))
    assert resolve(recipe, model, example).selected_names == chosen


def test_no_layer_is_a_user_error():
    base, _ = load_recipe("generic_all")
    with pytest.raises(UserError, match="no layer pays"):
        recipe_text(base, [], name="x", description="d")
