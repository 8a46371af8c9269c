"""Study report: Markdown structure, the self-check (and that it fails), plots, re-rendering."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from _records import FIXTURE, build_record, fixture_json

from quantstudy.record import SCHEMA_VERSION, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.report.markdown import render_markdown
from quantstudy.report.plots import KERNELS_PNG, KL_PNG, LATENCY_PNG, write_plots
from quantstudy.report.render import render_study
from quantstudy.report.selfcheck import allowed_numbers, check_markdown, number_tokens

SECTIONS = [
    "## Summary and decision",
    "## Recipe",
    "## Method",
    "## Results",
    "### Speed and size",
    "### Quality",
    "### Emulation gap",
    "### NaN/Inf scan",
    "### Kernel time per group",
    "### Variants",
    "## Warnings",
    "## Other formats",
    "## What was not tried",
    "## When to revisit",
]


@pytest.fixture(scope="module")
def record() -> StudyRecord:
    return StudyRecord.model_validate_json(FIXTURE.read_text())


@pytest.fixture(scope="module")
def md(record) -> str:
    return render_markdown(record)


def _as_version_1(data: dict) -> str:
    """A current record's JSON as schema version 1 wrote it: without the keys added since."""
    assert all(data[k] is None for k in ("sensitivity", "layer_speed", "search"))
    out = {k: v for k, v in data.items() if k not in ("sensitivity", "layer_speed", "search")}
    out["variants"] = [
        {k: v for k, v in var.items() if k not in ("predicted", "measured")}
        for var in data["variants"]
    ]
    assert all(var["predicted"] is None and var["measured"] is None for var in data["variants"])
    assert out["config"].get("fp8_kernel") is None
    added_to_config = ("fp8_kernel", "class_list", "strip_prefix", "eval_batch", "speed", "package")
    added_to_config += ("float32_engine",)  # schema 12
    added_to_config += ("quality",)  # schema 16
    added_to_config += ("fp8_accumulate",)  # schema 20
    assert out["config"]["fp8_accumulate"] is None
    assert out["config"]["quality"] is True and out["model"]["macs"] is None
    out["model"] = {k: v for k, v in out["model"].items() if k != "macs"}  # schema 16
    assert out["environment"]["lab_switches"] is None  # schema 20
    assert out["environment"]["triton"] is None  # schema 25
    later = ("lab_switches", "triton")
    out["environment"] = {k: v for k, v in out["environment"].items() if k not in later}
    out["config"] = {k: v for k, v in out["config"].items() if k not in (*added_to_config, "out")}
    assert out["recipe"]["bias_correction"] is False
    # schema 6: the FP8 quality options (their defaults: the version-1 behaviour)
    added_to_recipe = (
        "bias_correction",
        "rounding",
        "activation_granularity",
        "layer_calibrators",
        "migration",
        "migration_alpha",
        "propagated",  # schema 7 (as `sequential` until 26)
        "tune",  # schema 9
        "tune_epochs",
        "per_row_max_channels",  # schema 10
        "scale_candidates",  # schema 11
        "refine_sweeps",
        "headroom",
        "gelu",  # schema 27
    )
    out["recipe"] = {k: v for k, v in out["recipe"].items() if k not in added_to_recipe}
    for engine in data["engines"]:
        assert engine["fp8_kernel"] is None and engine["fp8_epilogue"] == {}
        assert engine["fp8_handoff"] == {} and engine["fp8_scaled_mm_output"] is None
    added = (
        "fp8_kernel",
        "fp8_epilogue",
        "fp8_handoff",
        "fp8_scaled_mm_output",
        "fp8_kernel_choice",
        "fp8_residual",  # schema 8
        "fp8_sum_handoff",
        "fp8_padded_output",  # schema 12
        "fp8_rewrites_skipped",  # schema 16
        "fp8_stepped_aside",  # schema 17
        "fp8_gelu",  # schema 27
    )
    out["engines"] = [{k: v for k, v in e.items() if k not in added} for e in data["engines"]]
    assert all(t["channel_mean"] is None for t in out["calibration"]["tensors"])
    out["calibration"] = out["calibration"] | {
        "tensors": [
            {k: v for k, v in t.items() if k not in ("channel_mean", "calibrator")}
            for t in out["calibration"]["tensors"]
        ]
    }
    added_to_speed = ("ideal", "layer_precision", "engine_version", "engine")  # schema 6
    assert all(out["speed"].get(k) is None for k in added_to_speed)
    out["speed"] = {k: v for k, v in out["speed"].items() if k not in added_to_speed}
    for key in ("digest", "timings"):  # schema 6
        assert out.pop(key) is None
    assert out.pop("sequential") is None  # schema 14
    assert out.pop("per_image") is None  # schema 14: the side file of per-image rows
    assert out["data"].pop("extended") == []  # schema 14: images added by `quantstudy extend`
    out["variants"] = [
        var | {"quality": {k: v for k, v in var["quality"].items() if k != "kl_mean_intervals"}}
        for var in out["variants"]
    ]
    # schema 6: KL-mean intervals and the FP8 engine against fp16 are new; the decision's gates
    # were text then (the fixture keeps its own, converted on load)
    split = ("engine_only_differ", "emulation_only_differ", "split_mcnemar_p")  # schema 12
    split += ("float32_agreement", "float32_differ_count", "float32_kl_mean")
    split += tuple(f"half_floor_{k}" for k in ("dtype", "agreement", "differ_count", "kl_mean"))
    split += ("floor_only_differ", "floor_emulation_only_differ", "floor_split_mcnemar_p")
    gap = out["quality"]["emulation_gap"]
    assert all(gap[k] is None for k in split)
    out["quality"]["emulation_gap"] = {k: v for k, v in gap.items() if k not in split}
    out["quality"] = {k: v for k, v in out["quality"].items() if k != "against_fp16"} | {
        "engines": [
            {k: v for k, v in e.items() if k != "kl_mean_intervals"}
            for e in out["quality"]["engines"]
        ]
    }
    out.pop("decision")
    out["schema_version"] = 1
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


def test_fixture_is_the_builders_record(record):
    # the fixture is a schema-version-1 file (old records must keep loading): to refresh its
    # numbers, write `_as_version_1(build_record().model_dump(mode="json"))` with the file's own
    # "decision" put back (`python tests/unit/_records.py` writes the current schema instead)
    built = build_record()
    assert built.schema_version == SCHEMA_VERSION
    if record.schema_version == SCHEMA_VERSION:
        assert fixture_json(built) == FIXTURE.read_text()
    else:  # a fixture written by schema version 1: an old file, which still loads
        assert record.schema_version == 1
        fixture = json.loads(FIXTURE.read_text())
        assert fixture.pop("decision")["ship"] is False
        assert record.decision.outcome == "not_ship"  # a text decision, converted on load
        assert json.loads(_as_version_1(built.model_dump(mode="json"))) == fixture
    assert record.model.architecture == "mobilenetv4_conv_large"
    assert len(record.recipe.selected) == 54
    assert [b.batch for b in record.speed.batches] == [1, 32, 128]
    assert len(record.quality.engines) == 5 and record.decision is not None


def test_rendered_report_passes_the_self_check(record, md):
    assert check_markdown(md, record) == []
    assert check_markdown(md, record.model_dump(mode="json")) == []


def test_report_structure_follows_the_seeds(record, md):
    assert md.startswith(
        "# FP8 quantization study (not shipped): mobilenetv4_conv_large.e500_r256_in1k\n"
    )
    positions = [md.index(s + "\n") for s in SECTIONS]
    assert positions == sorted(positions)
    # the gate table lists every gate with threshold, measured value and result
    for g in record.decision.gates:
        row = next(line for line in md.splitlines() if line.startswith(f"| {g.name} |"))
        assert g.measured in row and ("**fail**" in row) == (not g.passed)
    # the net change and the differing count are both reported, and not confused
    assert "(43 of 1500 images differ)" in md
    assert "a net change of -2 correct predictions (20 gained, 22 lost" in md
    # the recipe: real FP8, emulated and fp16 counts; the layer tables collapsed
    assert "53 of 54 selected layers" in md and "1 of 54 selected layers" in md
    assert "<summary>54 selected layers</summary>" in md
    assert "<summary>49 excluded candidates</summary>" in md
    # the timed region verbatim, in a fence
    assert "```text\n" + record.speed.timed_region + "\n```" in md
    # other formats are statements, never results
    assert "NVFP4: not tried" in md and "is a Hopper GPU" in md and "INT8: not tried" in md
    assert "No TensorRT engine was built" in md
    for item in record.not_run:
        assert f"- {item}\n" in md
    # when to revisit, from the failed gates
    assert "activation quantize fuses into its producer" in md
    assert "random weights" not in md.split("## When to revisit")[1]


def test_numbers_are_formatted_from_the_record(record, md):
    fp8 = next(e for e in record.quality.engines if e.engine == "fp8")
    b1 = record.speed.batches[0]
    assert f"{100 * fp8.agreement:.2f}%" in md
    assert f"{b1.fp16_ms.median:.3f} [{b1.fp16_ms.q1:.3f}, {b1.fp16_ms.q3:.3f}]" in md
    assert f"{b1.ratio.median:.2f} [{b1.ratio.q1:.2f}, {b1.ratio.q3:.2f}]" in md
    assert f"{record.speed.weight_bytes['fp8']} |" in md
    # the FP8 row of the quality table, cell by cell
    quality = md.split("### Quality\n")[1].split("### Emulation gap")[0]
    row = next(line for line in quality.splitlines() if line.startswith("| FP8 | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:8] == [
        "FP8",
        f"{100 * fp8.top1:.2f}%",
        f"{100 * fp8.top5:.2f}%",
        f"{100 * fp8.agreement:.2f}%",
        "43",
        "20",
        "22",
        "-2",
    ]
    assert cells[8] == (
        f"{100 * fp8.top1_change:+.2f} [{100 * fp8.ci_low:+.2f}, {100 * fp8.ci_high:+.2f}]"
    )


def test_hypotheses_are_stated_as_hypotheses(md):
    summary = md.split("## Recipe")[0]
    assert "we have not measured" in summary
    assert "likely" in summary


def test_self_check_flags_a_number_not_in_the_record(record, md):
    assert "81.99%" not in allowed_numbers(record)
    bad = md.replace("## Warnings\n", "## Warnings\n\nFP8 top-1 is 81.99% here.\n", 1)
    problems = check_markdown(bad, record)
    assert len(problems) == 1 and "81.99%" in problems[0]
    # a derived number (a difference the record does not hold) is caught too
    assert check_markdown(md + "\nFP8 saves 26.16 MiB.\n", record)


def test_self_check_flags_a_changed_number(record, md):
    fp8 = next(e for e in record.quality.engines if e.engine == "fp8")
    real = f"{100 * fp8.agreement:.2f}%"
    assert real == "97.13%"
    problems = check_markdown(md.replace(real, "97.31%"), record)
    assert problems and all("97.31%" in p for p in problems)


def test_self_check_flags_a_table_row_with_a_wrong_cell_count(record, md):
    bad = md.replace("| fp16 | 65175264 | 62.16 |", "| fp16 | 65175264 | 62.16 | extra |", 1)
    assert bad != md
    problems = check_markdown(bad, record)
    assert len(problems) == 1 and "4 cells, header has 3" in problems[0]
    short = md.replace("| FP8 | 37748736 | 36.00 |", "| FP8 | 37748736 |", 1)
    assert "2 cells, header has 3" in check_markdown(short, record)[0]


def test_self_check_flags_a_bad_separator_row(record):
    md = "# FP8 quantization study (not shipped): m\n\n| a | b |\n| --- |\n| 1 | 1 |\n"
    problems = check_markdown(md, record)
    assert problems == ["line 4: separator row has 1 cells, header has 2"]
    no_sep = "# FP8 quantization study (not shipped): m\n\n| a | b |\n| 1 | 1 |\n"
    assert "not a separator row" in check_markdown(no_sep, record)[0]


def test_self_check_flags_an_unbalanced_fence(record, md):
    bad = md.replace("## Warnings\n", "## Warnings\n\n```text\nnot closed\n", 1)
    problems = check_markdown(bad, record)
    assert any("never closed" in p for p in problems)
    # a shorter closing fence does not close a longer one
    assert check_markdown("# FP8 quantization study (not shipped): m\n````\nx\n```\n", record)


def test_self_check_flags_a_title_that_contradicts_the_decision(record, md):
    bad = md.replace("(not shipped)", "(shipped)", 1)
    assert any("title" in p for p in check_markdown(bad, record))


def test_self_check_ignores_code_links_and_identifiers(record):
    md = (
        "# FP8 quantization study (not shipped): mobilenetv4_conv_large\n\n"
        "1. fp16, fp8, e4m3, top-1, top-5, p99, H200, 1x1, `blocks.1.0.conv_pw`, sm90_xmma.\n"
        "![plot](figures/plot_77.png) [link](https://x.org/9999)\n\n"
        "```text\n12345.678 inside a fence\n```\n"
    )
    assert check_markdown(md, record) == []


def test_number_tokens_rule():
    text = "x 1.05x, -0.13 points, [0.99, 1.02], 0.99-1.04, top-1, 81.53%, v2.14.1, 2.14.1"
    assert list(number_tokens(text)) == [
        "1.05",
        "-0.13",
        "0.99",
        "1.02",
        "0.99",
        "1.04",
        "81.53%",
        "2.14.1",
    ]


def test_render_study_is_deterministic_and_writes_plots(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    shutil.copy(FIXTURE, study / "study.json")
    out = render_study(study)
    assert out == study / "report.md"
    first = {p.name: p.read_bytes() for p in study.iterdir()}
    assert {LATENCY_PNG, KERNELS_PNG, KL_PNG, "report.md", "study.json"} == set(first)
    for name in (LATENCY_PNG, KERNELS_PNG, KL_PNG):
        assert first[name].startswith(b"\x89PNG\r\n\x1a\n") and len(first[name]) > 5000
        assert f"]({name})" in first["report.md"].decode()
    render_study(study)
    second = {p.name: p.read_bytes() for p in study.iterdir()}
    assert first == second
    assert not [p for p in study.iterdir() if p.name.startswith(".")]  # no temp files left


def test_render_study_errors(tmp_path):
    with pytest.raises(UserError, match="study folder not found"):
        render_study(tmp_path / "missing")
    with pytest.raises(UserError, match="no study record"):
        render_study(tmp_path)
    (tmp_path / "study.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        render_study(tmp_path)
    data = json.loads(FIXTURE.read_text())
    del data["model"]
    (tmp_path / "study.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="model"):
        render_study(tmp_path)
    data = json.loads(FIXTURE.read_text())
    data["schema_version"] = 99
    (tmp_path / "study.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="schema_version"):
        render_study(tmp_path)
    assert not (tmp_path / "report.md").exists()


def test_partial_record_renders_with_not_measured(tmp_path):
    record = build_record(partial=True, with_decision=False)
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert md.startswith("# FP8 quantization study (not shipped)")
    assert "**Partial study** (status partial): not measured: quality, speed and decision." in md
    for s in ("Speed: not measured.", "Quality: not measured.", "Timing: not measured."):
        assert s in md
    assert "No decision is recorded" in md
    (tmp_path / "study.json").write_text(fixture_json(record))
    render_study(tmp_path)
    assert not any(p.suffix == ".png" for p in tmp_path.iterdir())  # no data, no plot


def test_stale_plots_are_removed(tmp_path):
    (tmp_path / "study.json").write_text(FIXTURE.read_text())
    render_study(tmp_path)
    (tmp_path / "study.json").write_text(fixture_json(build_record(partial=True)))
    render_study(tmp_path)
    assert not (tmp_path / LATENCY_PNG).exists()
    assert "latency.png" not in (tmp_path / "report.md").read_text()


def test_random_weights_banner():
    record = build_record(random_weights=True)
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    head = md.split("## Summary and decision")[0]
    assert "quality numbers are meaningless: random weights" in head
    assert "With pretrained weights" in md.split("## When to revisit")[1]


def test_cpu_banner_and_speed_gates(tmp_path):
    record = build_record(device="cpu")
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    head = md.split("## Summary and decision")[0]
    assert "timings on CPU are not meaningful" in head
    assert "Run the study on a GPU" in md
    assert "this study ran on cpu, without a GPU" in md
    assert re.search(r"\| speed at batch 1 \|.*\| inconclusive: timed on cpu", md)


def test_shipped_record_renders_shipped(tmp_path):
    record = build_record(
        speedup={1: 1.12, 32: 1.09, 128: 1.10}, outcomes={"fp8": (5, 4, 1, 0.004)}
    )
    assert record.decision.ship
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert md.startswith("# FP8 quantization study (shipped):")
    assert "FP8 shipped under this policy" in md
    assert "**fail**" not in md


def test_unlabelled_record_renders(tmp_path):
    record = build_record(labelled=False, with_variant=False)
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert "no labels" in md and "skipped: held-out set is unlabelled" in md
    assert "No recipe variant was studied." in md


def test_write_plots_skips_absent_data(tmp_path):
    record = build_record(device="cpu")  # no kernel breakdown on CPU
    written = write_plots(record, tmp_path)
    assert [p.name for p in written] == [LATENCY_PNG, KL_PNG]


def test_fused_engine_sentence_names_absorptions_handoffs_and_residual_sums(record):
    engines = []
    for e in record.engines:
        if e.name == "fp8":
            real = e.fp8_real[:3]
            e = e.model_copy(
                update={
                    "fp8_kernel": "fused",  # model_copy does not validate
                    "fp8_epilogue": {real[0]: "relu"},
                    "fp8_handoff": {real[1]: real[2]},
                    "fp8_residual": {real[0]: "relu", real[2]: "none"},
                    "fp8_sum_handoff": {real[0]: real[1]},
                    "fp8_padded_output": {real[1]: "blocks.1.0.conv_dw"},
                }
            )
        engines.append(e)
    fused = record.model_copy(update={"engines": engines})
    md = render_markdown(fused)
    assert "Activations computed in the FP8 layers' epilogue (1 of" in md
    assert "1 FP8 layer wrote the next FP8 layer's input already quantized" in md
    assert f"`{real[1]}` -> `{real[2]}`" in md
    assert "2 FP8 layers summed their block's residual in the epilogue" in md
    assert "1 of those also wrote the next FP8 layer's input, quantized, beside the sum" in md
    assert (
        f"none x1, relu x1; no fp16 output before the add): `{sorted([real[0], real[2]])[0]}`" in md
    )
    assert (
        "1 FP8 layer wrote its output inside the zero padding of the conv that reads it"
        f" (no padding pass between them): `{real[1]}` -> `blocks.1.0.conv_dw`." in md
    )
    assert check_markdown(md, fused) == []


def test_a_value_near_its_threshold_gets_one_more_digit_not_the_full_float():
    """x 1.05196 [1.05148, 1.05392] against >= 1.05: two decimals would print a tie."""
    from quantstudy.record import Gate
    from quantstudy.record.vocab import Direction, GateKind, GateMetric, GateStatus
    from quantstudy.report.sections.decision import interval_words, measured_words

    gate = Gate(
        name="speed at batch 128", kind=GateKind.SPEED, status=GateStatus.PASS,
        metric=GateMetric.SPEEDUP, batch=128, value=1.0519556065626459,
        low=1.0514804506405522, high=1.0539155501757396, threshold=1.05,
        direction=Direction.AT_LEAST,
    )  # fmt: skip
    assert measured_words(gate) == "1.052"
    assert interval_words(gate) == "[1.051, 1.054]"
    far = gate.model_copy(update={"value": 1.2345, "low": 1.05})
    assert measured_words(far) == "1.23"
    assert interval_words(far) == "[1.05, 1.054]"  # the threshold itself prints as it is


def test_method_section_says_what_output_tuning_trained(record):
    plain = render_markdown(record)
    assert "Output tuning" not in plain
    for tune, what in (("bias", "biases trained"), ("scale_bias", "per-output-channel gains")):
        recipe = record.recipe.model_copy(update={"tune": tune, "tune_epochs": 12})
        md = render_markdown(record.model_copy(update={"recipe": recipe}))
        assert "Output tuning (`quant/fitting/tune.py`)" in md and what in md and "12 epochs" in md


def test_rounding_searches_and_headroom_are_stated_and_pass_the_self_check(record):
    plain = render_markdown(record)
    assert "scale candidates" not in plain and "headroom" not in plain
    recipe = record.recipe.model_copy(
        update={
            "rounding": "compensating",
            "scale_candidates": 16,
            "refine_sweeps": 4,
            "headroom": 4.0,
        }
    )
    searched = record.model_copy(update={"recipe": recipe})
    md = render_markdown(searched)
    assert "rounded compensating (16 scale candidates per channel and 4 refinement sweeps)" in md
    assert "rounded on 16 scales" in md and "up to 4 coordinate-descent sweeps" in md
    assert "headroom x4" in md and "amax x 4" in md
    assert check_markdown(md, searched) == []


def test_emulation_gap_names_which_of_the_two_differs_from_fp32(record):
    """With the split recorded (schema 12), the report gives both counts and McNemar's p in
    place of the upper bound, and every number passes the self-check."""
    gap = record.quality.emulation_gap.model_copy(
        update={"engine_only_differ": 18, "emulation_only_differ": 8, "split_mcnemar_p": 0.0755}
    )
    split = record.model_copy(
        update={"quality": record.quality.model_copy(update={"emulation_gap": gap})}
    )
    md = render_markdown(split)
    assert "the FP8 engine alone differs on 18 images and its emulation alone on 8" in md
    assert "McNemar's exact test on that split, p = 0.0755" in md
    assert "not that it computes the recipe worse" in md  # no floor split recorded
    assert "so at most" not in md
    assert check_markdown(md, split) == []


def test_emulation_gap_sets_the_engine_split_beside_the_floor_split(record):
    """With the floor run's split recorded (schema 13), the report gives it as the scale for the
    engine's; every number passes the self-check."""
    gap = record.quality.emulation_gap.model_copy(
        update={"engine_only_differ": 18, "emulation_only_differ": 8, "split_mcnemar_p": 0.0755,
                "floor_only_differ": 14, "floor_emulation_only_differ": 3,
                "floor_split_mcnemar_p": 0.0127}
    )  # fmt: skip
    split = record.model_copy(
        update={"quality": record.quality.model_copy(update={"emulation_gap": gap})}
    )
    md = render_markdown(split)
    assert "its floor run (channels-last) alone differs on 14 images and it alone on 3" in md
    assert "(p = 0.0127)" in md and "not that it computes" not in md
    assert check_markdown(md, split) == []


def test_emulation_gap_shows_the_float32_engine_beside_the_floor(record):
    """A study run with `float32_engine` records the float32 engine's gap; the table gets its
    row and the report says what it separates; every number passes the self-check."""
    gap = record.quality.emulation_gap.model_copy(
        update={"float32_agreement": 0.9892, "float32_differ_count": 14, "float32_kl_mean": 0.00195,
                "floor_agreement": 0.99, "floor_differ_count": 13, "floor_kl_mean": 0.00196}
    )  # fmt: skip
    wide = record.model_copy(
        update={"quality": record.quality.model_copy(update={"emulation_gap": gap})}
    )
    md = render_markdown(wide)
    assert "| FP8 engine built in float32 vs fake-quant emulation | 98.92% | 14 | 0.00195 |" in md
    assert "the half-precision storage between its layers" in md
    assert check_markdown(md, wide) == []


def test_emulation_gap_shows_the_half_storage_floor(record):
    """The emulation with half-precision storage gets its row, named by its dtype, and the
    report says which engines it is the floor for; every number passes the self-check."""
    gap = record.quality.emulation_gap.model_copy(
        update={"half_floor_dtype": "float16", "half_floor_agreement": 0.9777,
                "half_floor_differ_count": 29, "half_floor_kl_mean": 0.00457}
    )  # fmt: skip
    half = record.model_copy(
        update={"quality": record.quality.model_copy(update={"emulation_gap": gap})}
    )
    md = render_markdown(half)
    row = "| emulation vs itself, values stored in float16 (floor) | 97.77% | 29 | 0.00457 |"
    assert row in md and "stores values as the half-precision engines do" in md
    assert check_markdown(md, half) == []
    assert "values stored in" not in render_markdown(record)


@pytest.mark.parametrize("heldout", ["auto", "auto:5000"])
def test_an_auto_heldout_is_not_reported_as_a_data_shortfall(record, heldout):
    """`--heldout auto[:MAX]` takes rounds until the gates settle: the images it used are where
    the rounds stopped, not all the data had."""
    auto = record.model_copy(
        update={"config": record.config.model_copy(update={"heldout": heldout})}
    )
    md = render_markdown(auto)
    used = record.data.heldout.n_images
    assert f"| held-out images | {heldout} ({used} used) |" in md
    assert "all the data had" not in md
    assert check_markdown(md, auto) == []


def test_a_fastest_engine_says_which_layers_stayed_in_fp16_and_the_report_checks(record):
    """A "fastest" FP8 engine that kept two selected layers in fp16: the recipe section
    counts and names them, its layer table says they ran in the engine's dtype because FP8
    was slower, the speed section lists their timings, and every number still comes from the
    record (self-check) and the record still agrees with itself."""
    from quantstudy.record import LayerKernel
    from quantstudy.report.meaning import check_meaning

    engines = []
    for e in record.engines:
        if e.name == "fp8":
            aside, kept = e.fp8_real[:2], e.fp8_real[2:]
            rows = [
                LayerKernel(name=n, kernel="fp16", fused_us=9.5, fp16_us=4.25, batch=b)
                for n in aside
                for b in record.config.batches
            ] + [LayerKernel(name=n, kernel="fused", why="FP8 hand-off") for n in kept]
            e = e.model_copy(update={"fp8_real": kept})
            e = e.model_validate(
                e.model_dump()
                | {"fp8_kernel": "fastest", "fp8_kernel_choice": rows, "fp8_stepped_aside": aside}
            )
        engines.append(e)
    fastest = StudyRecord.model_validate(
        record.model_copy(update={"engines": engines}).model_dump(mode="json")
    )
    md = render_markdown(fastest)
    assert "FP8 slower at every timed batch, `engines/step_aside.py`): 2 of " in md
    assert f"`{aside[0]}`, `{aside[1]}`." in md
    assert "float16 (FP8 slower)" in md
    assert f"Kept in fp16 (FP8 slower at every timed batch): 2 layers, `{aside[0]}`" in md
    assert f"| {aside[0]} | fp16 | 9.5 | not measured | 4.2 |" in md
    assert check_markdown(md, fastest) == []
    assert check_meaning(fastest) == []
