"""The search's tables in the study record (schema version 2) and in its report."""

from __future__ import annotations

import json
import random

import pytest
from _records import build_record, fixture_json

from quantstudy.decision.schema import Policy, QualityPolicy
from quantstudy.record import (
    SCHEMA_VERSION,
    LayerSensitivity,
    LayerSpeed,
    LayerSpeedSection,
    Measured,
    SearchSection,
    SensitivitySection,
    StudyRecord,
    TimingStats,
    Variant,
)
from quantstudy.record.errors import UserError
from quantstudy.record.load import load_record
from quantstudy.report.markdown import render_markdown
from quantstudy.report.plots import available_plots
from quantstudy.report.render import render_study
from quantstudy.report.search_plots import SENSITIVITY_PNG
from quantstudy.report.selfcheck import check_markdown
from quantstudy.search.select import (
    LayerEvidence,
    budget_from_policy,
    predict,
    select_layers,
)

POLICY = Policy(quality=QualityPolicy(agreement={"min": 0.97}, kl_mean={"max": 0.02}))


def _timing(median: float) -> TimingStats:
    return TimingStats(
        median=median, q1=median * 0.98, q3=median * 1.03, min=median * 0.9, max=median * 1.2, n=9
    )


def _search_record(n_layers: int = 20, source: str = "measured", all_but: bool = True):
    """The default test record with a search's three sections and the candidate as a variant."""
    base = build_record()
    rng = random.Random(7)
    names = [d.name for d in base.recipe.selected][:n_layers]
    kl = {n: rng.uniform(0.0, 0.004) for n in names}
    dis = {n: rng.choice([0.0, 0.0, 0.0013, 0.0027]) for n in names}
    saved = {n: rng.uniform(-0.004, 0.02) for n in names}
    by_kl = sorted(names, key=lambda n: -kl[n])
    sensitivity = SensitivitySection(
        reference="fp32",
        n_images=256,
        subset="256 of the 1500 held-out images, sampled with seed '0:sensitivity'",
        ids_sha256="ab" * 32,
        modes=["only", "all_but"] if all_but else ["only"],
        ranked_by="KL mean with only the layer quantized, largest first",
        all_kl_mean=0.0107,
        all_agreement=0.9727,
        layers=[
            LayerSensitivity(
                layer=n,
                kind="conv2d.1x1",
                rank=i + 1,
                kl_mean=kl[n],
                kl_max=kl[n] * 40,
                agreement=1.0 - dis[n],
                differ_count=round(dis[n] * 1500),
                all_but_kl_mean=0.0107 - kl[n] if all_but else None,
                all_but_agreement=0.9727 + dis[n] if all_but else None,
                all_but_differ_count=41 - round(dis[n] * 1500) if all_but else None,
            )
            for i, n in enumerate(by_kl)
        ],
    )
    by_saved = sorted(names, key=lambda n: -saved[n])
    if source == "measured":
        layer_speed = LayerSpeedSection(
            source="measured",
            source_detail="NVIDIA H200",
            meaningful=True,
            batch=128,
            compile_mode="max-autotune",
            timed_region="one layer's forward at its recorded input shape",
            rounds=9,
            iters_per_round=50,
            warmup=20,
            layers=[
                LayerSpeed(
                    layer=n,
                    kind="conv2d.1x1",
                    batch=128,
                    input_shape=[128, 64, 28, 28],
                    fp8_path="real",
                    rank=i + 1,
                    saved_ms=saved[n],
                    fp16_ms=_timing(0.05),
                    fp8_ms=_timing(0.05 - saved[n]),
                    ratio=_timing(0.05 / (0.05 - saved[n])),
                    warnings=["spread above 5%"] if i == 0 else [],
                )
                for i, n in enumerate(by_saved)
            ],
        )
    else:
        layer_speed = LayerSpeedSection(
            source="file",
            source_detail="gains/h200-b128.json",
            meaningful=False,
            batch=128,
            layers=[
                LayerSpeed(layer=n, batch=128, rank=i + 1, saved_ms=saved[n])
                for i, n in enumerate(by_saved)
            ],
        )
    evidence = [LayerEvidence(n, kl[n], dis[n], saved[n]) for n in names]
    budget = budget_from_policy(POLICY, "builtin:default", margin=0.5)
    choices, method = select_layers(evidence, budget)
    chosen = [c.layer for c in choices if c.chosen]
    fp8 = next(e for e in base.quality.engines if e.engine == "fp8")
    candidate_measured = Measured(
        study="studies/m/search-x-seed0/candidate",
        recipe="mobilenetv4_pointwise",
        n_layers=len(names),
        kl_mean=0.011,
        agreement=0.9713,
        fakequant_kl_mean=0.0108,
        fakequant_agreement=0.972,
        batch=128,
        fp16_ms=4.512,
        fp8_ms=4.456,
        speedup=1.012,
        speed_meaningful=True,
        ship=False,
    )
    search = SearchSection(
        candidate_recipe="builtin:mobilenetv4_pointwise",
        method=method,
        budget=budget,
        choices=choices,
        predicted=predict(evidence, chosen, 128, 4.512),
        candidate_predicted=predict(evidence, names, 128, 4.512),
        candidate_measured=candidate_measured,
        recipe_file="studies/m/search-x-seed0/mobilenetv4_pointwise.searched.yaml",
        verified=Measured(
            study="studies/m/search-x-seed0/searched",
            recipe="mobilenetv4_pointwise.searched",
            n_layers=len(chosen),
            kl_mean=0.0041,
            agreement=0.9893,
            batch=128,
            fp16_ms=4.513,
            fp8_ms=4.401,
            speedup=1.025,
            speed_meaningful=True,
            ship=True,
        ),
    )
    variant = Variant(
        name="candidate",
        recipe="builtin:mobilenetv4_pointwise",
        selected_count=len(names),
        quality=fp8,
        speed=base.speed.batches,
        predicted=search.candidate_predicted,
        measured=candidate_measured,
    )
    return base.model_copy(
        update={
            "sensitivity": sensitivity,
            "layer_speed": layer_speed,
            "search": search,
            "variants": [*base.variants, variant],
            "not_run": [x for x in base.not_run if "sensitivity" not in x],
        }
    )


def _results(md: str) -> str:
    return md.split("### Variants\n")[1].split("## Warnings")[0]


def test_search_record_round_trips_through_json():
    record = _search_record()
    assert record.schema_version == SCHEMA_VERSION
    data = record.model_dump(mode="json")
    again = StudyRecord.model_validate_json(json.dumps(data))
    assert again == record and again.variants[-1].predicted is not None


@pytest.mark.parametrize("source", ["measured", "file"])
@pytest.mark.parametrize("all_but", [True, False])
def test_search_sections_render_and_pass_the_self_check(source, all_but):
    record = _search_record(source=source, all_but=all_but)
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert check_markdown(md, record.model_dump(mode="json")) == []
    assert render_markdown(record) == md  # deterministic
    results = _results(md)
    heads = ["#### Per-layer sensitivity", "#### Per-layer speed", "#### Recipe search"]
    positions = [results.index(h + "\n") for h in heads]
    assert positions == sorted(positions)
    # the sensitivity table: rank, layer, KL mean, agreement, and the all-but columns if measured
    top = record.sensitivity.layers[0]
    header = "| Rank | Layer | Kind | KL mean | KL max | Agreement | Differ |"
    assert header in results
    assert ("All-but KL mean" in results) == all_but
    assert f"| 1 | `{top.layer}` | conv2d.1x1 |" in results
    # the source of the gains, said plainly
    from_file = "**These per-layer gains were not measured by this study**"
    assert (from_file in results) == (source == "file")
    assert ("Measured by this study on NVIDIA H200" in results) == (source == "measured")
    # prediction beside measurement, for the candidate and the searched recipe
    for row in ("| candidate | predicted, batch 128 |", "| candidate | measured, batch 128 |"):
        assert row in results
    for row in ("| searched | predicted, batch 128 |", "| searched | measured, batch 128 |"):
        assert row in results
    assert results.count("| candidate | predicted") == 1  # not repeated from the search section
    # the long tables collapse like the other sections'
    assert "<summary>20 layers ranked by sensitivity</summary>" in results
    assert "<summary>20 layers ranked by saved time</summary>" in results
    assert "<summary>20 candidate layers: choice and reason</summary>" in results
    # the variants table lists the candidate
    assert "| candidate | `builtin:mobilenetv4_pointwise` | 20 |" in results
    closing = md.split("## What was not tried")[1]
    assert "are not part of this record" not in closing
    assert ("were read from a file" in closing) == (source == "file")


def test_short_tables_are_not_collapsed():
    record = _search_record(n_layers=5)
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    assert "layers ranked by sensitivity</summary>" not in md
    assert "| Rank | Layer | Kind | KL mean |" in md


def test_a_number_not_in_the_record_is_caught_in_the_new_tables():
    record = _search_record()
    md = render_markdown(record)
    kl = record.sensitivity.layers[0].kl_mean
    from quantstudy.report.format import fmt_sig

    bad = md.replace(f"| {fmt_sig(kl)} |", "| 0.123456 |", 1)
    assert bad != md
    assert any("0.123456" in p for p in check_markdown(bad, record))


def test_render_study_writes_and_links_the_sensitivity_plot(tmp_path):
    record = _search_record()
    assert SENSITIVITY_PNG in {name for name, _ in available_plots(record)}
    (tmp_path / "study.json").write_text(fixture_json(record))
    out = render_study(tmp_path)
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert first[SENSITIVITY_PNG].startswith(b"\x89PNG\r\n\x1a\n")
    assert f"]({SENSITIVITY_PNG})" in out.read_text()
    render_study(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first  # deterministic
    assert load_record(tmp_path / "study.json") == record
    # the sections gone, the plot goes with them
    (tmp_path / "study.json").write_text(fixture_json(build_record()))
    render_study(tmp_path)
    assert not (tmp_path / SENSITIVITY_PNG).exists()
    assert SENSITIVITY_PNG not in (tmp_path / "report.md").read_text()


def test_a_record_without_the_search_renders_without_its_tables():
    md = render_markdown(build_record())
    for head in ("#### Per-layer sensitivity", "#### Per-layer speed", "#### Recipe search"):
        assert head not in md


def test_unknown_schema_versions_are_refused(tmp_path):
    for version in (0, SCHEMA_VERSION + 1, "2", True):
        data = json.loads(fixture_json(build_record()))
        data["schema_version"] = version
        (tmp_path / "study.json").write_text(json.dumps(data))
        with pytest.raises(UserError, match="schema_version"):
            load_record(tmp_path / "study.json")


def test_option_steps_render_their_paired_change_and_pass_the_self_check():
    """Schema 12's paired KL change per option: its column and the rule that kept it; every
    number in the record."""
    from quantstudy.record import OptionStep
    from quantstudy.report.format import fmt_sig

    record = _search_record()
    steps = [
        OptionStep(option="recipe's own options", kl_mean=0.0143, agreement=0.975, kept=True),
        OptionStep(option="rounding: compensating", kl_mean=0.0121, agreement=0.978, kept=True,
                   kl_change=-0.0022, kl_change_low=-0.0031, kl_change_high=-0.0013, share=1.0),
        OptionStep(option="migration: smooth", kl_mean=0.0120, agreement=0.977, kept=False,
                   kl_change=-0.0001, kl_change_low=-0.0006, kl_change_high=0.0004),
    ]  # fmt: skip
    search = record.search.model_copy(update={"options": steps})
    record = record.model_copy(update={"search": search})
    md = render_markdown(record)
    change = f"{fmt_sig(-0.0001)} [{fmt_sig(-0.0006)}, {fmt_sig(0.0004)}]"
    assert f"| migration: smooth | {fmt_sig(0.0120)} | {change} | 97.70% | not kept | - |" in md
    assert "lay below zero" in md and "KL change [95% CI]" in md
    assert check_markdown(md, record) == []
