"""`quantstudy recipes` and `recipes show` output: every layer listed, JSON that round-trips."""

from __future__ import annotations

import json

import torch
from torch import nn

from quantstudy.recipe.builtin import builtin_names, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.recipe.schema import parse_recipe
from quantstudy.recipe.show import format_recipe_list, format_resolution
from quantstudy.record import LayerDecision

torch.set_num_threads(1)

RECIPE = b"""\
name: small
rules:
  - include: {op: conv2d, kernel: 1}
    why: pointwise
  - exclude: {position: last_linear}
    why: classifier stays fp16
"""


def resolved():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.Conv2d(8, 16, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return resolve(parse_recipe(RECIPE, "small.yaml"), model, torch.randn(1, 3, 8, 8))


def test_text_lists_every_layer_with_rule_and_reason():
    res = resolved()
    text = format_resolution(res, "small", "toy", as_json=False)
    assert (
        text.splitlines()[0] == "recipe small on toy: 1 of 4 conv2d/linear layers selected for FP8"
    )
    lines = text.splitlines()
    start = lines.index("Selected (1):")
    header, row = lines[start + 1].split(), lines[start + 2]
    assert header == ["#", "layer", "kind", "shape", "input", "rule", "why"]
    assert row.split()[:3] == ["0", "2", "conv2d.1x1"]
    assert "1x1 s1 8->16" in row and "8x8" in row and row.endswith("rules[0]  pointwise")
    assert "conv2d.depthwise" in text and "3x3 s1 g8 8->8" in text
    assert "rules[1]" in text and "classifier stays fp16" in text
    assert "no include rule matched" in text  # the 3x3 stem and the depthwise conv
    assert "selected.total             1" in text and "candidates.total           4" in text


def test_json_is_machine_readable_and_complete():
    res = resolved()
    doc = json.loads(format_resolution(res, "small", "toy", as_json=True))
    assert doc["recipe"] == "small" and doc["model"] == "toy"
    assert [LayerDecision.model_validate(d) for d in doc["selected"]] == res.selected
    assert [LayerDecision.model_validate(d) for d in doc["excluded"]] == res.excluded
    assert doc["counts"] == res.counts
    assert doc["excluded"][-1] == {**doc["excluded"][-1], "name": "5", "rule": 1, "selected": False}


def test_recipe_list_shows_every_builtin_and_the_defaults():
    text = format_recipe_list()
    for name in builtin_names():
        assert f"  {name} " in text
        recipe, _ = load_recipe(name)
        assert recipe.description in text
    assert "[variant of res2net_all_after_stem]" in text
    assert "mobilenetv4_*" in text and "(other)" in text
