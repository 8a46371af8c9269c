"""The TensorRT pre-screen of a resolved recipe (`recipe/tensorrt.py`) and where it is shown."""

from __future__ import annotations

import json

from quantstudy.cli import main
from quantstudy.recipe.tensorrt import prescreen, prescreen_lines
from quantstudy.record import LayerDecision


def _conv(name, k=1, groups=1, cin=64, cout=64) -> LayerDecision:
    return LayerDecision(
        name=name,
        op="conv2d",
        module_class="Conv2d",
        kernel=(k, k),
        stride=(1, 1),
        groups=groups,
        in_channels=cin,
        out_channels=cout,
        selected=True,
        reason="test",
    )


def test_each_documented_limit_is_flagged_with_its_reason():
    layers = [
        _conv("dense"),
        _conv("dw", k=3, groups=64),
        _conv("grouped", groups=4),
        _conv("huge", k=33),
        _conv("thin", cin=8),
    ]
    flags = {f.layer: f.reason for f in prescreen(layers)}
    assert set(flags) == {"dw", "grouped", "huge", "thin"}
    assert flags["dw"].startswith("depthwise conv")
    assert flags["grouped"].startswith("grouped (4 groups) conv")
    assert "larger than 32x32" in flags["huge"]
    assert "8 -> 64 channels" in flags["thin"]
    assert all(f.source for f in prescreen(layers))


def test_clean_recipe_says_so():
    assert prescreen_lines([_conv("a"), _conv("b")]) == [
        "TensorRT pre-screen: no flag on the 2 selected layers."
    ]


def test_recipes_show_prints_the_prescreen(capsys):
    assert main(["recipes", "show", "generic_all", "--model", "test_efficientnet"]) == 0
    out = capsys.readouterr().out
    assert "TensorRT pre-screen:" in out
    assert "blocks.3.0.conv_dw: depthwise conv" in out
    assert main(["recipes", "show", "generic_all", "--model", "test_efficientnet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "blocks.3.0.conv_dw" in {f["layer"] for f in doc["tensorrt_prescreen"]}
