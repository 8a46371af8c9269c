"""`run_search` end to end on the CPU: gains from a file, two real (CPU) studies, a recipe."""

import json

import pytest
import torch
import yaml

from quantstudy.model.loading import load_model
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record import SCHEMA_VERSION, StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.load import load_record
from quantstudy.report.markdown import render_markdown
from quantstudy.report.selfcheck import check_markdown
from quantstudy.search.compare import summary_lines
from quantstudy.search.run import SearchConfig, run_search

torch.set_num_threads(1)


def _study(data, tmp_path) -> StudyConfig:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 2\nquality:\n  kl_mean: {max: 1.0}\n  agreement: {min: 0.5}\n")
    return StudyConfig(
        model="mobilenetv4_conv_small",
        data=data,
        weights="random",
        calib=4,
        heldout=8,
        device="cpu",
        batches=(2,),
        policy=policy,
        eval_batch=8,
    )


@pytest.mark.suite  # a whole search with its verifying study: `make test-suites`
def test_search_on_cpu_with_a_gains_file(tiny_imagenet, tmp_path):
    study = _study(tiny_imagenet, tmp_path)
    model = load_model("mobilenetv4_conv_small", "random").model
    example = torch.zeros(1, 3, 224, 224)
    base, _ = load_recipe("mobilenetv4_pointwise")
    layers = resolve(base, model, example).selected_names
    # the first three layers slow down, every other one saves a little
    gains = {name: (-0.01 if i < 3 else 0.001 * (i + 1)) for i, name in enumerate(layers)}
    gains_path = tmp_path / "gains.json"
    gains_path.write_text(json.dumps({"batch": 2, "saved_ms": gains}))

    result = run_search(
        SearchConfig(
            study=study, gains=gains_path, sensitivity_images=6, out=tmp_path / "s", options=False
        )
    )
    search = result.search
    chosen = [c.layer for c in search.choices if c.chosen]
    assert chosen and not set(chosen) & set(layers[:3])
    assert search.predicted.kl_mean <= search.budget.kl_budget
    assert 1 - search.predicted.agreement <= search.budget.disagreement_budget + 1e-12
    assert search.predicted.saved_ms == pytest.approx(sum(gains[n] for n in chosen))
    assert search.predicted.fp16_ms is None  # CPU timings: no whole-model prediction

    recipe, _ = load_recipe(search.recipe_file)
    assert resolve(recipe, model, example).selected_names == chosen
    verified = json.loads((tmp_path / "s" / "searched" / "study.json").read_text())
    assert verified["status"] == "complete"
    assert [d["name"] for d in verified["recipe"]["selected"]] == chosen
    assert search.verified is not None and search.verified.n_layers == len(chosen)
    assert search.candidate_measured.n_layers == len(layers)

    saved = json.loads((tmp_path / "s" / "search.json").read_text())
    assert len(saved["sensitivity"]["layers"]) == len(layers)
    assert saved["layer_speed"]["source"] == "file"
    assert saved["search"]["verified"]["recipe"] == "mobilenetv4_pointwise.searched"
    assert (tmp_path / "s" / "sensitivity.png").stat().st_size > 0
    assert any(line.startswith("searched measured") for line in summary_lines(search))

    # the tables are in the verifying study's own record too, and in its report
    searched = tmp_path / "s" / "searched"
    record = load_record(searched / "study.json")
    assert record.schema_version == SCHEMA_VERSION
    assert record.sensitivity == result.sensitivity and record.search == search
    assert record.layer_speed == result.layer_speed and record.layer_speed.source == "file"
    assert not any("recipe search were not run" in x for x in record.not_run)
    # a decision that does not ship is still a decision (`Decision.__bool__` is `ship`)
    assert record.decision is not None and search.verified.ship == record.decision.ship
    assert search.candidate_measured.ship is not None
    (variant,) = record.variants
    assert variant.name == "candidate" and variant.selected_count == len(layers)
    assert variant.predicted == search.candidate_predicted
    assert variant.measured == search.candidate_measured
    assert variant.quality is not None and variant.quality.engine == "fp8"
    md = (searched / "report.md").read_text()
    assert check_markdown(md, record) == []
    assert md == render_markdown(record)
    assert "#### Per-layer sensitivity" in md and "#### Recipe search" in md
    assert "**These per-layer gains were not measured by this study**" in md
    assert "| searched | measured" in md and "| candidate | predicted" in md
    assert (searched / "sensitivity.png").stat().st_size > 0
    assert "](sensitivity.png)" in md


def test_search_without_gpu_or_gains_is_refused_before_any_work(tiny_imagenet, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal without a GPU")
    with pytest.raises(UserError, match="per-layer speed needs a CUDA GPU"):
        run_search(SearchConfig(study=_study(tiny_imagenet, tmp_path), out=tmp_path / "s"))
    assert not (tmp_path / "s").exists()


@pytest.mark.suite  # a whole search: `make test-suites`
def test_search_keeps_the_recipes_bias_correction(tiny_imagenet, tmp_path):
    base, _ = load_recipe("mobilenetv4_pointwise")
    data = base.model_dump(mode="json")
    data["name"] = "pointwise_bc"
    data["weights"]["bias_correction"] = True
    recipe_file = tmp_path / "pointwise_bc.yaml"
    recipe_file.write_text(yaml.safe_dump(data))
    model = load_model("mobilenetv4_conv_small", "random").model
    layers = resolve(base, model, torch.zeros(1, 3, 224, 224)).selected_names
    gains_path = tmp_path / "gains.json"
    gains_path.write_text(json.dumps({"batch": 2, "saved_ms": dict.fromkeys(layers, 0.001)}))
    study = _study(tiny_imagenet, tmp_path).replace(recipe=str(recipe_file))

    result = run_search(
        SearchConfig(
            study=study, gains=gains_path, sensitivity_images=6, out=tmp_path / "s", options=False
        )
    )
    candidate = load_record(tmp_path / "s" / "candidate" / "study.json")
    assert candidate.recipe.bias_correction
    # the means that rebuild the correction are in the record, one per input channel
    for t in candidate.calibration.tensors:
        layer = model.get_submodule(t.consumers[0])
        assert t.channel_mean is not None and len(t.channel_mean) == layer.in_channels
    emitted, _ = load_recipe(result.search.recipe_file)
    assert emitted.weights.bias_correction
    searched = load_record(tmp_path / "s" / "searched" / "study.json")
    assert searched.recipe.bias_correction and searched.status == "complete"
