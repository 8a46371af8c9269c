"""Built-in recipes on the real timm architectures (random weights, CPU): the seed study counts.

The expected numbers come from the seed write-ups (/work/shared/seeds): mobilenetv4_conv_large
54 1x1 convs with 45 depthwise left fp16; ghostnet_100 38 of its 95 convs; xception41 43 of its
84 convs; res2net50_26w_4s 84, and 68 without layer1; crossvit_9_240 36 encoder linears plus
12 cross-attention linears.
"""

from __future__ import annotations

import hashlib
import shutil
from importlib import resources
from pathlib import Path

import pytest
import timm
import torch
from torch import nn

from quantstudy.recipe.builtin import (
    FALLBACK_RECIPE,
    FAMILY_RECIPES,
    builtin_names,
    default_recipe_for,
    load_recipe,
)
from quantstudy.recipe.resolve import Resolution, resolve
from quantstudy.recipe.show import format_recipe_list
from quantstudy.record.errors import UserError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def zoo():
    """Create each timm model once per module, with a batch-1 example at its default size."""
    cache: dict[str, tuple[nn.Module, torch.Tensor]] = {}

    def get(name: str) -> tuple[nn.Module, torch.Tensor]:
        if name not in cache:
            torch.manual_seed(0)
            model = timm.create_model(name, pretrained=False).eval()
            example = torch.randn(1, *model.pretrained_cfg["input_size"])
            cache[name] = (model, example)
        return cache[name]

    return get


def run(zoo, model_name: str, recipe_name: str) -> Resolution:
    model, example = zoo(model_name)
    recipe, _ = load_recipe(recipe_name)
    return resolve(recipe, model, example)


def convs(model: nn.Module) -> dict[str, nn.Conv2d]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def selected(res: Resolution) -> set[str]:
    return {d.name for d in res.selected}


def excluded(res: Resolution) -> dict[str, str]:
    return {d.name: d.reason for d in res.excluded}


# --- the five seed studies ----------------------------------------------------------------------


def test_mobilenetv4_conv_large_54_pointwise_45_depthwise_fp16(zoo):
    model, _ = zoo("mobilenetv4_conv_large")
    res = run(zoo, "mobilenetv4_conv_large", "mobilenetv4_pointwise")
    assert res.counts["selected.total"] == res.counts["selected.conv2d.1x1"] == 54
    assert res.counts["excluded.conv2d.depthwise"] == 45
    block_1x1 = {
        n for n, m in convs(model).items()
        if n.startswith("blocks.") and m.kernel_size == (1, 1) and m.groups == 1
    }  # fmt: skip
    assert selected(res) == block_1x1
    out = excluded(res)
    for fp16 in ("conv_stem", "blocks.0.0.conv_exp", "conv_head", "classifier"):
        assert fp16 in out and "fp16 in the study" in out[fp16]


@pytest.mark.parametrize(
    "name", ["mobilenetv4_conv_small_050", "mobilenetv4_conv_small", "mobilenetv4_conv_medium"]
)
def test_other_mobilenetv4_sizes_resolve_to_their_block_1x1_convs(zoo, name):
    model, _ = zoo(name)
    res = run(zoo, name, "mobilenetv4_pointwise")
    expected = {
        n for n, m in convs(model).items()
        if n.startswith("blocks.") and m.kernel_size == (1, 1) and m.groups == 1
    }  # fmt: skip
    assert selected(res) == expected and len(expected) > 0
    depthwise = {n for n, m in convs(model).items() if m.groups > 1}
    assert depthwise <= set(excluded(res))
    assert {"conv_stem", "conv_head", "classifier"} <= set(excluded(res))
    assert res.notes == []


def test_mobilenetv4_depthwise_variant_adds_exactly_the_depthwise_convs(zoo):
    base = run(zoo, "mobilenetv4_conv_large", "mobilenetv4_pointwise")
    variant = run(zoo, "mobilenetv4_conv_large", "mobilenetv4_pointwise_depthwise")
    added = selected(variant) - selected(base)
    assert len(added) == 45 and selected(base) <= selected(variant)
    assert all(d.groups == d.in_channels > 1 for d in variant.selected if d.name in added)


def test_ghostnet_100_38_of_95_convs(zoo):
    model, _ = zoo("ghostnet_100")
    assert len(convs(model)) == 95
    res = run(zoo, "ghostnet_100", "ghostnet_pointwise")
    assert res.counts["selected.total"] == res.counts["selected.conv2d.1x1"] == 38
    assert all(d.input_hw is not None and max(d.input_hw) > 1 for d in res.selected)
    out = excluded(res)
    se_convs = [n for n in convs(model) if ".se." in n]
    assert len(se_convs) == 14 and all("squeeze-excite" in out[n] for n in se_convs)
    assert res.counts["excluded.conv2d.depthwise"] == 41
    assert {"conv_stem", "conv_head", "classifier"} <= set(out)
    # 1 stem + 41 depthwise + 15 squeeze-excite and head convs are the 57 convs left in fp16
    assert sum(d.op == "conv2d" for d in res.excluded) == 57


def test_ghostnet_depthwise_variant(zoo):
    res = run(zoo, "ghostnet_100", "ghostnet_pointwise_depthwise")
    assert res.counts["selected.conv2d.1x1"] == 38
    assert res.counts["selected.conv2d.depthwise"] == 41
    assert res.counts["selected.total"] == 79


def test_xception41_43_of_84_convs(zoo):
    model, _ = zoo("xception41")
    assert len(convs(model)) == 84
    res = run(zoo, "xception41", "xception_pointwise")
    assert res.counts["selected.total"] == res.counts["selected.conv2d.1x1"] == 43
    assert all(d.groups == 1 and d.kernel == (1, 1) for d in res.selected)
    assert any(d.stride == (2, 2) for d in res.selected)  # the strided 1x1 shortcuts count
    out = excluded(res)
    assert {"stem.0.conv", "stem.1.conv", "head.fc"} <= set(out)
    assert res.counts["excluded.conv2d.depthwise"] == 39
    variant = run(zoo, "xception41", "xception_pointwise_depthwise")
    assert variant.counts["selected.total"] == 82


def test_res2net50_26w_4s_84_after_stem_and_68_without_layer1(zoo):
    model, _ = zoo("res2net50_26w_4s")
    res = run(zoo, "res2net50_26w_4s", "res2net_all_after_stem")
    assert res.counts["selected.total"] == 84
    assert selected(res) == set(convs(model)) - {"conv1"}
    assert set(excluded(res)) == {"conv1", "fc"}
    no_l1 = run(zoo, "res2net50_26w_4s", "res2net_no_layer1")
    assert no_l1.counts["selected.total"] == 68
    layer1 = {n for n in convs(model) if n.startswith("layer1.")}
    assert len(layer1) == 16 and selected(no_l1) == selected(res) - layer1
    assert all("no layer1" in excluded(no_l1)[n] for n in layer1)


def test_crossvit_9_240_36_encoder_plus_12_cross_attention(zoo):
    res = run(zoo, "crossvit_9_240", "crossvit_encoder_cross")
    picked = selected(res)
    encoder = {n for n in picked if ".blocks." in n}
    cross = {n for n in picked if ".fusion." in n}
    assert len(encoder) == 36 and len(cross) == 12 and picked == encoder | cross
    assert {n.rsplit(".", 2)[-2] + "." + n.rsplit(".", 1)[-1] for n in encoder} == {
        "attn.qkv", "mlp.fc1", "mlp.fc2"
    }  # fmt: skip
    assert {n.rsplit(".", 1)[-1] for n in cross} == {"wk", "wv"}
    assert res.counts["selected.linear"] == 48
    out = excluded(res)
    assert (
        "blocks.0.blocks.0.0.attn.proj" in out
        and "TensorRT 11.4" in out["blocks.0.blocks.0.0.attn.proj"]
    )
    assert {"head.0", "head.1", "patch_embed.0.proj", "blocks.0.fusion.0.attn.wq"} <= set(out)
    assert all(reason != "no include rule matched" for reason in out.values())
    mlp = run(zoo, "crossvit_9_240", "crossvit_mlp_only")
    assert selected(mlp) == {n for n in encoder if ".mlp." in n} and len(selected(mlp)) == 24


def test_crossvit_recipe_uses_per_tensor_weight_scales():
    recipe, _ = load_recipe("crossvit_encoder_cross")
    assert recipe.weights.granularity == "per_tensor"  # seed 003: per-tensor amax / 448


def test_generic_pointwise_keeps_squeeze_excite_out(zoo):
    model, _ = zoo("efficientnet_b0")
    res = run(zoo, "efficientnet_b0", "generic_pointwise")
    expected = {
        n for n, m in convs(model).items()
        if m.kernel_size == (1, 1) and m.groups == 1 and m.stride == (1, 1) and ".se." not in n
    }  # fmt: skip
    assert selected(res) == expected and "conv_head" in expected  # 7x7 map: kept
    assert all("1x1 map" in r for n, r in excluded(res).items() if ".se." in n)


def test_generic_recipes_resolve_on_a_seed_model(zoo):
    model, _ = zoo("res2net50_26w_4s")
    n_convs = len(convs(model))
    assert run(zoo, "res2net50_26w_4s", "generic_all").counts["selected.total"] == n_convs + 1
    assert (
        run(zoo, "res2net50_26w_4s", "generic_dense_convs").counts["selected.total"] == n_convs - 1
    )
    assert run(zoo, "res2net50_26w_4s", "generic_linears").counts["selected.total"] == 0


# --- built-in files, loading, defaults ------------------------------------------------------------


def test_every_builtin_is_well_formed():
    names = builtin_names()
    assert len(names) >= 14
    for name in names:
        recipe, source = load_recipe(name)
        assert recipe.name == name and source == f"builtin:{name}"
        assert recipe.description
        assert recipe.variant_of is None or recipe.variant_of in names
        # every rule says why, so every layer in the table has a reason from the recipe
        assert all(rule.why for rule in recipe.rules), name


def test_builtin_files_comment_their_exclusions():
    folder = resources.files("quantstudy.recipe").joinpath("builtin")
    for name in builtin_names():
        text = folder.joinpath(f"{name}.yaml").read_text()
        assert text.startswith("#"), f"{name}.yaml has no header comment"


def test_variants_are_listed_with_their_base():
    """`quantstudy recipes` marks each variant with its base (and nothing else as a variant)."""
    listed = format_recipe_list().splitlines()
    marked = {
        line.split()[0]: line.split("[variant of ")[1].split("]")[0]
        for line in listed
        if "[variant of " in line
    }
    assert marked == {
        "res2net_no_layer1": "res2net_all_after_stem",
        "crossvit_mlp_only": "crossvit_encoder_cross",
        "ghostnet_pointwise_depthwise": "ghostnet_pointwise",
        "xception_pointwise_depthwise": "xception_pointwise",
        "mobilenetv4_pointwise_depthwise": "mobilenetv4_pointwise",
        "generic_pointwise_bc": "generic_pointwise",
        "generic_pointwise_compensated": "generic_pointwise",
        "generic_pointwise_depthwise": "generic_pointwise",
        "generic_pointwise_propagated": "generic_pointwise",
    }
    assert set(marked.values()) <= set(builtin_names())


def test_builtin_sha256_is_of_the_packaged_file():
    recipe, source = load_recipe("builtin:ghostnet_pointwise")
    raw = resources.files("quantstudy.recipe").joinpath("builtin", "ghostnet_pointwise.yaml")
    assert recipe.sha256 == hashlib.sha256(raw.read_bytes()).hexdigest()
    assert source == "builtin:ghostnet_pointwise"


def test_user_recipe_file_works_like_the_builtin(zoo, tmp_path: Path):
    packaged = resources.files("quantstudy.recipe").joinpath("builtin", "res2net_no_layer1.yaml")
    mine = tmp_path / "my_recipe.yaml"
    with resources.as_file(packaged) as src:
        shutil.copyfile(src, mine)
    model, example = zoo("res2net50_26w_4s")
    from_file, source = load_recipe(mine)
    assert source == str(mine)
    builtin, _ = load_recipe("res2net_no_layer1")
    a, b = resolve(from_file, model, example), resolve(builtin, model, example)
    assert a.selected == b.selected and a.excluded == b.excluded and a.counts == b.counts
    assert a.to_info(from_file, source).sha256 == b.to_info(builtin, "builtin:x").sha256
    again, source_str = load_recipe(str(mine))
    assert source_str == str(mine) and again.sha256 == from_file.sha256


def test_user_file_errors_name_the_file(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nrules:\n  - include: {kernal: 1}\n")
    with pytest.raises(UserError, match=r"bad\.yaml line 3: rules\[0\]\.include: unknown selector"):
        load_recipe(path)


def test_load_errors():
    with pytest.raises(
        UserError, match=r"unknown recipe 'nope'.*built-ins: crossvit_encoder_cross"
    ):
        load_recipe("nope")
    with pytest.raises(UserError, match="recipe file not found"):
        load_recipe("missing/recipe.yaml")
    with pytest.raises(UserError, match="unknown recipe 'nope'"):
        load_recipe("builtin:nope")


def test_family_recipe_on_another_family_fails_loudly(zoo):
    model, example = zoo("ghostnet_100")
    recipe, _ = load_recipe("res2net_no_layer1")
    with pytest.raises(UserError, match=r"builtin:res2net_no_layer1 line \d+: rules\[1\]\.exclude"):
        resolve(recipe, model, example)


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("mobilenetv4_conv_large.e500_r256_in1k", "mobilenetv4_pointwise"),
        ("timm/mobilenetv4_conv_small.e2400_r224_in1k", "mobilenetv4_pointwise"),
        ("ghostnet_100.in1k", "ghostnet_pointwise"),
        ("xception41.tf_in1k", "xception_pointwise"),
        ("res2net50_26w_4s.in1k", "res2net_all_after_stem"),
        ("res2net101_26w_4s", "res2net_all_after_stem"),
        ("crossvit_9_240.in1k", "crossvit_encoder_cross"),
        ("tf_efficientnet_lite0", "generic_pointwise"),
        ("efficientnet_b0.ra_in1k", "generic_pointwise"),
        ("resnet50", "generic_default"),
    ],
)
def test_default_recipe_for(model_name: str, expected: str):
    assert default_recipe_for(model_name) == expected


def test_family_defaults_name_existing_builtins():
    names = builtin_names()
    assert FALLBACK_RECIPE in names
    assert all(recipe in names for recipe in FAMILY_RECIPES.values())


def test_deterministic_on_a_real_model(zoo):
    model, example = zoo("mobilenetv4_conv_small")
    recipe, source = load_recipe("mobilenetv4_pointwise")
    first = resolve(recipe, model, example).to_info(recipe, source).model_dump_json()
    torch.manual_seed(123)
    fresh = timm.create_model("mobilenetv4_conv_small", pretrained=False)
    second = resolve(recipe, fresh, torch.randn_like(example)).to_info(recipe, source)
    assert first == second.model_dump_json()
