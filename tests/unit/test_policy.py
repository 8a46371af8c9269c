"""Decision policy: loading, validation, and ship / not-ship verdicts on constructed records."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _records import build_record
from pydantic import ValidationError

from quantstudy.decision import policy as pol
from quantstudy.decision.policy import Policy, decide, load_policy
from quantstudy.record import StudyRecord
from quantstudy.record.errors import UserError

FAST = {1: 1.12, 32: 1.09, 128: 1.10}
# fp8: 5 gained, 4 lost, 1 wrong-to-wrong: agreement 99.33%, CI low about -0.35 points
GOOD_FP8 = {"fp8": (5, 4, 1, 0.004)}


def _decide(record: StudyRecord, policy: Policy | None = None):
    p, label = (policy, "test") if policy else load_policy(None)
    return decide(record, p, label)


def _gate(decision, name):
    return next(g for g in decision.gates if g.name == name)


@pytest.fixture(scope="module")
def ship_record() -> StudyRecord:
    return build_record(speedup=FAST, outcomes=GOOD_FP8, with_decision=False)


# --- loading ------------------------------------------------------------------------------


def test_default_policy_file_is_the_model_default():
    policy, label = load_policy(None)
    assert label == "builtin:default"
    assert policy == Policy()
    assert policy.speed.min_speedup == 1.05
    assert policy.speed.q1_speedup_above == 1.0
    assert policy.speed.batches is None
    assert policy.quality.top1_change_ci_low_above == -0.005
    assert policy.quality.min_agreement == 0.97
    assert policy.quality.max_kl_mean == 0.02


def test_default_policy_file_documents_every_field():
    text = (Path(pol.__file__).parent / "default_policy.yaml").read_text()
    data = yaml.safe_load(text)
    for section, model in (("speed", pol.SpeedPolicy), ("quality", pol.QualityPolicy)):
        assert set(data[section]) == set(model.model_fields)
        for field in model.model_fields:
            # the line before (or the line of) each key is a comment
            idx = text.index(f"  {field}:")
            before = text[:idx].rstrip().splitlines()[-1].strip()
            line = text[idx:].splitlines()[0]
            assert before.startswith("#") or "#" in line, field


def test_policy_file_overrides_and_label(tmp_path):
    f = tmp_path / "strict.yaml"
    f.write_text("speed:\n  min_speedup: 1.2\n  batches: [1]\nquality:\n  min_agreement: 0.99\n")
    policy, label = load_policy(f)
    assert label == str(f)
    assert policy.speed.min_speedup == 1.2
    assert policy.speed.batches == [1]
    assert policy.quality.min_agreement == 0.99
    assert policy.quality.max_kl_mean == 0.02  # untouched keys keep the default


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("speed:\n  min_sped: 1.1\n", "speed.min_sped: unknown key"),
        ("speeed:\n  min_speedup: 1.1\n", "speeed: unknown key"),
        ("speed:\n  min_speedup: fast\n", "speed.min_speedup"),
        ("speed:\n  min_speedup: 0.9\n", "speed.min_speedup"),
        ("quality:\n  min_agreement: 1.5\n", "quality.min_agreement"),
        ("quality:\n  max_kl_mean: -1\n", "quality.max_kl_mean"),
        ("speed:\n  batches: []\n", "speed.batches"),
        ("speed:\n  batches: [1, 1]\n", "speed.batches"),
        ("version: 2\n", "version"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("speed: [1.05\n", "not valid YAML"),
    ],
)
def test_bad_policy_file_names_the_key(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as err:
        load_policy(f)
    assert needle in str(err.value)
    assert str(f) in str(err.value)


def test_missing_policy_file(tmp_path):
    with pytest.raises(UserError, match="policy file not found"):
        load_policy(tmp_path / "nope.yaml")


# --- decisions ----------------------------------------------------------------------------


def test_ships_when_every_gate_passes(ship_record):
    d = _decide(ship_record)
    assert d.ship and bool(d)
    assert d.failed == []
    assert all(g.passed for g in d.gates)
    names = [g.name for g in d.gates]
    for b in (1, 32, 128):
        assert f"speed margin at batch {b}" in names
        assert f"speed spread at batch {b}" in names
    assert {"top-1 change CI", "top-1 agreement", "KL mean", "no NaN/Inf"} <= set(names)
    assert d.summary.startswith("Shipped under builtin:default")
    assert d.policy == "builtin:default"


def test_gate_records_threshold_and_measured_from_the_record(ship_record):
    d = _decide(ship_record)
    bs = next(b for b in ship_record.speed.batches if b.batch == 32)
    g = _gate(d, "speed margin at batch 32")
    assert g.threshold == "median x >= 1.05 (compile mode max-autotune)"
    assert g.measured.startswith(f"median x {bs.ratio.median:.2f} ")
    assert f"{bs.fp16_ms.median:.3f} ms" in g.measured
    fp8 = next(e for e in ship_record.quality.engines if e.engine == "fp8")
    agree = _gate(d, "top-1 agreement")
    assert agree.measured == f"{100 * fp8.agreement:.2f}% ({fp8.differ_count} of 1500 differ)"


def test_not_shipped_when_one_batch_is_under_the_margin():
    record = build_record(
        speedup={1: 1.12, 32: 1.035, 128: 1.10},
        noise=0.004,
        outcomes=GOOD_FP8,
        with_decision=False,
    )
    b32 = next(b for b in record.speed.batches if b.batch == 32)
    assert 1.0 < b32.ratio.q1 and b32.ratio.median < 1.05  # the construction holds
    d = _decide(record)
    assert not d.ship and not bool(d)
    assert d.failed == ["speed margin at batch 32"]
    assert "speed margin at batch 32" in d.summary


def test_not_shipped_when_the_spread_reaches_one():
    # median x about 1.06, but round-to-round noise puts q1 at or below 1.0
    record = build_record(
        speedup={1: 1.06, 32: 1.12, 128: 1.12},
        noise=0.09,
        outcomes=GOOD_FP8,
        with_decision=False,
    )
    b1 = record.speed.batches[0]
    assert b1.ratio.q1 <= 1.0 < b1.ratio.median
    d = _decide(record)
    assert "speed spread at batch 1" in d.failed
    assert not d.ship


def test_not_shipped_for_quality_agreement_below_threshold():
    # 5 gained, 5 lost, 51 moved between wrong classes: agreement 95.93%, top-1 unchanged
    record = build_record(speedup=FAST, outcomes={"fp8": (5, 5, 51, 0.012)}, with_decision=False)
    d = _decide(record)
    assert d.failed == ["top-1 agreement"]
    g = _gate(d, "top-1 agreement")
    assert g.measured.startswith("95.93% (61 of 1500 differ)")
    assert "top-1 agreement" in d.summary


def test_agreement_tie_at_display_precision_is_shown_with_more_digits(ship_record):
    fp8 = next(e for e in ship_record.quality.engines if e.engine == "fp8")
    policy = Policy(quality={"min_agreement": fp8.agreement + 1e-5})
    g = _gate(_decide(ship_record, policy), "top-1 agreement")
    assert not g.passed
    shown, needed = g.measured.split("%")[0], g.threshold.split("%")[0].removeprefix(">= ")
    assert shown != needed


def test_not_shipped_for_kl_above_threshold():
    record = build_record(speedup=FAST, outcomes={"fp8": (5, 4, 1, 0.031)}, with_decision=False)
    d = _decide(record)
    assert d.failed == ["KL mean"]


def test_not_shipped_for_top1_ci_low_below_threshold():
    record = build_record(speedup=FAST, outcomes={"fp8": (2, 14, 0, 0.006)}, with_decision=False)
    fp8 = next(e for e in record.quality.engines if e.engine == "fp8")
    assert fp8.ci_low < -0.005
    assert _decide(record).failed == ["top-1 change CI"]


def test_size_alone_never_ships():
    # FP8 weights 37% smaller, quality fine, but not faster: never a reason to ship
    record = build_record(
        speedup={1: 1.0, 32: 0.97, 128: 0.98},
        outcomes=GOOD_FP8,
        fp8_weight_bytes=24_000_000,
        with_decision=False,
    )
    assert record.speed.weight_bytes["fp8"] < record.speed.weight_bytes["fp16"]
    d = _decide(record)
    assert not d.ship
    assert d.failed and all(name.startswith("speed") for name in d.failed)
    assert all(g.passed for g in d.gates if g.kind == "quality")
    assert {g.kind for g in d.gates} == {"speed", "quality"}  # no size gate exists


def test_cpu_timings_never_ship():
    # the ratios look like a win, but they were taken on a CPU
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, device="cpu", with_decision=False)
    assert not record.speed.meaningful
    d = _decide(record)
    assert not d.ship
    speed = [g for g in d.gates if g.kind == "speed"]
    assert len(speed) == 6 and not any(g.passed for g in speed)
    assert all(g.measured.startswith("not measured on GPU") for g in speed)
    assert all(g.passed for g in d.gates if g.kind == "quality")


def test_absent_speed_section_fails_speed_gates(ship_record):
    record = ship_record.model_copy(update={"speed": None, "status": "partial"})
    d = _decide(record)
    assert not d.ship
    speed = [g for g in d.gates if g.kind == "speed"]
    assert [g.name for g in speed] == [
        f"speed {w} at batch {b}" for b in (1, 32, 128) for w in ("margin", "spread")
    ]
    assert all(not g.passed and "not measured" in g.measured for g in speed)


def test_absent_quality_section_fails_quality_gates(ship_record):
    record = ship_record.model_copy(update={"quality": None, "status": "partial"})
    d = _decide(record)
    assert not d.ship
    assert d.failed == ["top-1 change CI", "top-1 agreement", "KL mean", "no NaN/Inf"]


def test_random_weights_never_ship():
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, random_weights=True, with_decision=False)
    d = _decide(record)
    assert not d.ship
    assert d.failed == ["top-1 change CI", "top-1 agreement", "KL mean"]
    for name in d.failed:
        assert _gate(d, name).measured.startswith("not meaningful (random weights)")
    assert _gate(d, "no NaN/Inf").passed  # still evaluated: NaN is a defect with any weights


def test_unlabelled_data_skips_the_top1_gate_unless_required():
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, labelled=False, with_decision=False)
    d = _decide(record)
    g = _gate(d, "top-1 change CI")
    assert g.passed and g.skipped_reason and "unlabelled" in g.measured
    assert d.ship
    assert "(1 skipped: top-1 change CI)" in d.summary
    strict = Policy(quality={"require_labels": True})
    d2 = _decide(record, strict)
    assert d2.failed == ["top-1 change CI"]


def test_nonfinite_output_fails():
    record = build_record(
        speedup=FAST,
        outcomes=GOOD_FP8,
        nonfinite={"fp8": ["extreme_pos_1e4"]},
        with_decision=False,
    )
    d = _decide(record)
    assert d.failed == ["no NaN/Inf"]
    assert "extreme_pos_1e4" in _gate(d, "no NaN/Inf").measured


def test_nonfinite_in_another_engine_fails_too():
    record = build_record(
        speedup=FAST,
        outcomes=GOOD_FP8,
        nonfinite={"fp16": ["n01440764/ILSVRC2012_val_00000501.JPEG"]},
        with_decision=False,
    )
    d = _decide(record)
    assert d.failed == ["no NaN/Inf"]
    assert "fp16: 1 held-out" in _gate(d, "no NaN/Inf").measured


def test_target_batches_from_the_policy(ship_record):
    slow32 = build_record(
        speedup={1: 1.12, 32: 0.9, 128: 1.10}, outcomes=GOOD_FP8, with_decision=False
    )
    assert not _decide(slow32).ship
    assert _decide(slow32, Policy(speed={"batches": [1, 128]})).ship
    d = _decide(ship_record, Policy(speed={"batches": [1, 64]}))
    assert d.failed == ["speed margin at batch 64", "speed spread at batch 64"]
    assert "batch 64 was not timed" in _gate(d, "speed margin at batch 64").measured


def test_compile_mode_mismatch_fails_speed(ship_record):
    d = _decide(ship_record, Policy(speed={"compile_mode": "default"}))
    assert not d.ship
    speed = [g for g in d.gates if g.kind == "speed"]
    assert all(not g.passed and "max-autotune" in g.measured for g in speed)


def test_compile_mode_the_pipeline_records_can_pass(ship_record):
    """The record names our modes (default, max-autotune), and so does the policy."""
    assert ship_record.speed.compile_mode == "max-autotune"
    assert _decide(ship_record, Policy(speed={"compile_mode": "max-autotune"})).ship


def test_unknown_compile_mode_in_policy_is_refused():
    with pytest.raises(ValidationError):
        Policy(speed={"compile_mode": "reduce-overhead"})


def test_margin_is_configurable(ship_record):
    assert not _decide(ship_record, Policy(speed={"min_speedup": 1.3})).ship


def test_decision_round_trips_through_the_record(ship_record):
    d = _decide(ship_record)
    record = ship_record.model_copy(update={"decision": d})
    again = StudyRecord.model_validate_json(record.model_dump_json())
    assert again.decision == d and bool(again.decision)
