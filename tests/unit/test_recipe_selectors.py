"""Each selector against hand-made candidates: what it matches and what it must not."""

from __future__ import annotations

import pytest

from quantstudy.recipe.selectors import MATCHERS, PATTERNS, Candidate, Selector, layer_kind


def conv(name="blocks.0.conv", k=1, s=1, groups=1, cin=16, cout=32, hw=(8, 8), **kw) -> Candidate:
    return Candidate(0, name, "conv2d", kw.pop("cls", "Conv2d"), (k, k), (s, s), groups, cin,
                     cout, hw, positions=frozenset(kw.pop("positions", ())))  # fmt: skip


def linear(name="head.fc", cin=64, cout=10, hw=(1, 1), positions=()) -> Candidate:
    return Candidate(0, name, "linear", "Linear", None, None, 1, cin, cout, hw,
                     positions=frozenset(positions))  # fmt: skip


def sel(**kw) -> Selector:
    return Selector.model_validate(kw)


def test_every_selector_key_has_exactly_one_matcher():
    assert set(MATCHERS) == set(Selector.model_fields)
    assert set(PATTERNS) <= set(MATCHERS)


def test_empty_selector_matches_everything():
    assert sel().matches(conv()) and sel().matches(linear())


def test_op():
    assert sel(op="conv2d").matches(conv()) and not sel(op="conv2d").matches(linear())
    assert sel(op=["conv2d", "linear"]).matches(linear())


def test_kernel_int_means_square_and_linear_has_no_kernel():
    assert sel(kernel=1).matches(conv(k=1))
    assert not sel(kernel=1).matches(conv(k=3))
    assert sel(kernel=[3, 3]).matches(conv(k=3))
    rect = Candidate(0, "c", "conv2d", "Conv2d", (3, 1), (1, 1), 1, 4, 4, (8, 8))
    assert sel(kernel=[3, 1]).matches(rect) and not sel(kernel=3).matches(rect)
    assert not sel(kernel=1).matches(linear())


def test_groups_kinds():
    dense, dw, grouped = conv(groups=1), conv(groups=16, cin=16, cout=16), conv(groups=4)
    assert sel(groups="dense").matches(dense) and not sel(groups="dense").matches(dw)
    assert sel(groups="depthwise").matches(dw) and not sel(groups="depthwise").matches(grouped)
    assert sel(groups="grouped").matches(grouped) and not sel(groups="grouped").matches(dense)
    # a depthwise conv with a channel multiplier (out = 2 x in) is still depthwise
    assert sel(groups="depthwise").matches(conv(groups=16, cin=16, cout=32))
    assert sel(groups="dense").matches(linear())


def test_layer_kind_never_overlaps():
    assert layer_kind("conv2d", (1, 1), 8, 8) == "conv2d.depthwise"  # 1x1 depthwise
    assert layer_kind("conv2d", (1, 1), 1, 8) == "conv2d.1x1"
    assert layer_kind("conv2d", (3, 3), 2, 8) == "conv2d.grouped"
    assert layer_kind("conv2d", (3, 1), 1, 8) == "conv2d.kxk"
    assert layer_kind("linear", None, 1, 8) == "linear"


def test_stride_and_channels():
    assert sel(stride=2).matches(conv(s=2)) and not sel(stride=2).matches(conv(s=1))
    assert not sel(stride=1).matches(linear())
    assert sel(in_channels_min=16).matches(conv(cin=16))
    assert not sel(in_channels_min=17).matches(conv(cin=16))
    assert sel(out_channels_min=32).matches(conv(cout=32))
    assert not sel(out_channels_min=33).matches(conv(cout=32))
    assert sel(channels_multiple_of=16).matches(conv(cin=16, cout=32))
    assert not sel(channels_multiple_of=16).matches(conv(cin=24, cout=32))
    assert not sel(channels_multiple_of=16).matches(conv(cin=16, cout=40))


def test_input_size_selectors_and_unexecuted_layers():
    one, big, tall, unknown = conv(hw=(1, 1)), conv(hw=(7, 7)), conv(hw=(5, 1)), conv(hw=None)
    larger = sel(input_larger_than=1)
    assert not larger.matches(one) and larger.matches(big) and larger.matches(tall)
    assert sel(input_hw_max=1).matches(one) and not sel(input_hw_max=1).matches(tall)
    assert sel(input_hw_min=7).matches(big) and not sel(input_hw_min=7).matches(tall)
    assert sel(input_hw_min=[5, 1]).matches(tall)
    for s in (larger, sel(input_hw_max=1), sel(input_hw_min=1)):
        assert not s.matches(unknown)  # a layer the example pass never ran has no input size


def test_name_patterns():
    c = conv(name="layer1.0.conv1")
    assert sel(name_glob="layer1.*").matches(c) and not sel(name_glob="layer2.*").matches(c)
    assert sel(name_glob=["x", "*.conv1"]).matches(c)
    assert sel(name_regex=r"layer\d\.0\.conv1").matches(c)
    assert not sel(name_regex="conv1").matches(c)  # the whole name must match
    assert sel(stage="layer1").matches(c) and sel(stage="layer1.").matches(c)
    assert not sel(stage="layer1").matches(conv(name="layer10.0.conv1"))
    assert sel(stage="conv1").matches(conv(name="conv1"))
    assert not sel(stage="conv1").matches(c)  # a prefix, not a substring


def test_module_class_is_the_exact_class_name():
    assert sel(module_class="Conv2dSame").matches(conv(cls="Conv2dSame"))
    assert not sel(module_class="Conv2d").matches(conv(cls="Conv2dSame"))


def test_position():
    first = conv(positions=["first_conv"])
    assert sel(position="first_conv").matches(first)
    assert not sel(position="last_conv").matches(first)
    assert sel(position=["last_conv", "last_linear"]).matches(linear(positions=["last_linear"]))


def test_selectors_combine_with_and():
    s = sel(op="conv2d", kernel=1, groups="dense", input_larger_than=1)
    assert s.matches(conv(k=1, hw=(7, 7)))
    assert not s.matches(conv(k=1, hw=(1, 1)))
    assert not s.matches(conv(k=3, hw=(7, 7)))
    assert not s.matches(conv(k=1, groups=16, cin=16, cout=16))


def test_describe_for_default_reasons():
    assert sel(op="conv2d", kernel=1).describe() == "op=conv2d kernel=1x1"
    assert sel().describe() == "every layer"


@pytest.mark.parametrize("bad", [{"kernal": 1}, {"op": "conv3d"}, {"groups": "depth"}])
def test_selector_rejects_unknown_keys_and_values(bad):
    with pytest.raises(ValueError):
        sel(**bad)
