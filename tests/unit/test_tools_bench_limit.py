"""`tools/lab/bench/limit.py` end to end on the CPU (plumbing only: nothing is timed
meaningfully there, so no ideal x), and its Markdown table."""

import json

import pytest
from _tools import load_tool

_limit = load_tool("lab/bench/limit.py")
main, render = _limit.main, _limit.render


def test_limit_runs_on_cpu_and_renders_its_table(tiny_imagenet, tmp_path, capsys):
    out = tmp_path / "limit.json"
    main(["--images", str(tiny_imagenet), "--out", str(out), "--models", "test_resnet",
          "--device", "cpu", "--batches", "2", "--n-images", "4", "--rounds", "1",
          "--iters", "1", "--kernels", "fused,fastest", "--agreement"])  # fmt: skip
    result = json.loads(out.read_text())
    (model,) = result["models"]
    assert set(model["kernels"]) == {"fused", "fastest"}
    fastest = model["kernels"]["fastest"]
    assert fastest["ideal"] == [] and "GPU timings" in fastest["ideal_not_computed"]
    assert {c["why"] for c in fastest["kernel_choice"]} == {"not timed off CUDA"}
    assert 0 <= fastest["agreement_with_emulation"] <= 1 and model["emulation_floor"] == 1.0
    table = render([out]).splitlines()
    assert len(table) == 2 + 2  # header, rule, one row per kernel at the one batch
    assert table[2].startswith("| test_resnet | fused | 2 | ")
    assert table[3].split(" | ")[4] == "0"  # no layer moved to scaled_mm off CUDA


def test_limit_takes_a_recipe_for_every_model(tiny_imagenet, tmp_path):
    """`--recipe` replaces the family default: with the depthwise variant every selected
    depthwise conv of a tiny EfficientNet runs real FP8 in the fused engine."""
    out = tmp_path / "limit.json"
    main(["--images", str(tiny_imagenet), "--out", str(out), "--models", "test_efficientnet",
          "--device", "cpu", "--batches", "2", "--n-images", "4", "--rounds", "1",
          "--iters", "1", "--kernels", "fused",
          "--recipe", "generic_pointwise_depthwise"])  # fmt: skip
    (model,) = json.loads(out.read_text())["models"]
    assert model["recipe"] == "builtin:generic_pointwise_depthwise"
    fused = model["kernels"]["fused"]
    assert fused["fp8_emulated"] == 0 and fused["fp8_real"] == model["selected"]
    assert fused["fp8_handoffs"] > 0  # FP8 storage around the depthwise convs


def test_limit_reads_its_models_through_the_one_model_list_reader(tiny_imagenet, tmp_path):
    """The seeds are a model list (`study/model_list.py`); `--list` names another, whose
    entries' recipes and weights each model takes."""
    from quantstudy.record.errors import UserError
    from quantstudy.study.model_list import read_model_list

    seeds = {e.name: e for e in read_model_list(_limit.SEEDS).entries}
    assert len(seeds) == 6 and seeds["tf_efficientnet_lite0"].weights == "efficientnet-lite0"
    listed = tmp_path / "list.yaml"
    listed.write_text(
        "models:\n  - {name: test_efficientnet, recipe: generic_pointwise_depthwise}\n"
    )
    out = tmp_path / "limit.json"
    main(["--images", str(tiny_imagenet), "--out", str(out), "--list", str(listed),
          "--device", "cpu", "--batches", "2", "--n-images", "4", "--rounds", "1",
          "--iters", "1", "--kernels", "fused"])  # fmt: skip
    (model,) = json.loads(out.read_text())["models"]
    assert model["model"] == "test_efficientnet"
    assert model["recipe"] == "builtin:generic_pointwise_depthwise"  # the entry's, not the family's
    listed.write_text("models:\n  - {name: test_efficientnet, family: x, kernel: fused}\n")
    with pytest.raises(UserError, match=r"line 2: models\.0\.kernel: unknown key"):
        main(["--images", str(tiny_imagenet), "--out", str(out), "--list", str(listed),
              "--device", "cpu"])  # fmt: skip


def test_limit_times_each_residual_variant_under_its_own_name(tiny_imagenet, tmp_path):
    """`--residual both --sum-handoff --pad-apart`: the fused engine with its sums, with their
    FP8 copies too, with its padding passes kept, and with the adds apart; the unfused engine
    once (it never sums in its epilogue). (ResNet pads inside its convs: nothing to write.)"""
    out = tmp_path / "limit.json"
    main(["--images", str(tiny_imagenet), "--out", str(out), "--models", "test_resnet",
          "--device", "cpu", "--batches", "2", "--n-images", "4", "--rounds", "1",
          "--iters", "1", "--kernels", "fused,scaled_mm", "--residual", "both",
          "--sum-handoff", "--pad-apart"])  # fmt: skip
    (model,) = json.loads(out.read_text())["models"]
    rows = model["kernels"]
    assert set(rows) == {
        "fused", "fused/sum-handoff", "fused/pad-apart", "fused/residual-apart", "scaled_mm"
    }  # fmt: skip
    assert rows["fused/pad-apart"]["fp8_residual_sums"] == rows["fused"]["fp8_residual_sums"]
    assert rows["fused"]["fp8_padded_outputs"] == 0
    assert rows["fused"]["fp8_residual_sums"] > 0 and rows["fused"]["fp8_sum_handoffs"] == 0
    assert rows["fused/sum-handoff"]["fp8_sum_handoffs"] > 0
    assert rows["fused/residual-apart"]["fp8_residual_sums"] == 0
    assert rows["scaled_mm"]["fp8_residual_sums"] == 0


def test_limit_refuses_an_unknown_recipe_before_loading_anything(tmp_path):
    from quantstudy.record.errors import UserError

    with pytest.raises(UserError, match="no_such_recipe"):
        main(["--images", str(tmp_path), "--out", str(tmp_path / "l.json"), "--device", "cpu",
              "--recipe", "no_such_recipe"])  # fmt: skip
    assert not (tmp_path / "l.json").exists()


def test_limit_builds_the_plan_with_every_option_of_the_recipe(tiny_imagenet, tmp_path):
    """The timed plan is the study's (`prepare_study`): a recipe's rounding, its searches and
    bias correction reach it (a plan built from the layers and scales alone would round to
    nearest)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: compensated\n"
        "weights: {rounding: compensating, scale_candidates: 4, refine_sweeps: 1,"
        " bias_correction: true}\n"
        "rules:\n  - include: {op: conv2d, kernel: 1}\n"
    )
    out = tmp_path / "limit.json"
    main(["--images", str(tiny_imagenet), "--out", str(out), "--models", "test_resnet",
          "--device", "cpu", "--batches", "2", "--n-images", "4", "--rounds", "1",
          "--iters", "1", "--kernels", "fused", "--recipe", str(recipe)])  # fmt: skip
    (model,) = json.loads(out.read_text())["models"]
    assert model["plan"] == {
        "per_channel": True, "bias_correction": True, "rounding": "compensating",
        "scale_candidates": 4, "refine_sweeps": 1, "row_scales": False, "migrated_layers": 0,
        "sequential": False,
    }  # fmt: skip
