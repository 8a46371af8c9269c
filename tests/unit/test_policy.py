"""Decision policy: presets, files, validation errors, and verdicts on constructed records."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _records import build_record
from pydantic import ValidationError

from quantstudy.decision import policy as pol
from quantstudy.decision.policy import EXIT_CODES, PRESETS, decide, load_policy
from quantstudy.decision.preview import heldout_preview
from quantstudy.decision.schema import AgreementPolicy, KlPolicy, Policy, SpeedPolicy, Top1Policy
from quantstudy.record import StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Baseline, GateStatus, Missing, Outcome

FAST = {1: 1.12, 32: 1.09, 128: 1.10}
# fp8: 5 gained, 4 lost, 1 wrong-to-wrong on 1500 images: agreement 99.33%
GOOD_FP8 = {"fp8": (5, 4, 1, 0.004)}
DECISION_DIR = Path(pol.__file__).parent


def _decide(record: StudyRecord, policy: Policy | None = None):
    p, label = (policy, "test") if policy else load_policy(None)
    return decide(record, p, label)


def _gate(decision, name):
    return next(g for g in decision.gates if g.name == name)


@pytest.fixture(scope="module")
def ship_record() -> StudyRecord:
    return build_record(speedup=FAST, outcomes=GOOD_FP8, with_decision=False)


# --- presets and files --------------------------------------------------------------------


def test_default_preset_is_the_model_default():
    policy, label = load_policy(None)
    assert label == "builtin:default"
    assert policy == Policy()
    assert policy.confidence == 0.95
    assert policy.quality.top1.baseline == Baseline.FP16
    assert policy.quality.top1.threshold == -0.005
    assert policy.quality.agreement.baseline == Baseline.FP32
    assert policy.quality.min_agreement == 0.97  # what the search's budget reads
    assert policy.quality.max_kl_mean == 0.02


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads_and_says_when_to_use_it(name):
    policy, label = load_policy(name)
    assert label == f"builtin:{name}"
    text = (DECISION_DIR / f"{name}.yaml").read_text()
    assert "When to use it:" in text
    assert load_policy(Path(name))[0] == policy  # --policy arrives as a path


def test_presets_differ_in_the_documented_direction():
    strict, default, latency = (load_policy(n)[0] for n in ("strict", "default", "latency-first"))
    assert strict.confidence > default.confidence > latency.confidence
    margins = [p.quality.top1.margin_points for p in (strict, default, latency)]
    assert margins == sorted(margins)


def test_default_preset_documents_every_field():
    text = (DECISION_DIR / "default.yaml").read_text()
    data = yaml.safe_load(text)
    assert set(data) == set(Policy.model_fields)
    parts = {
        "speed": (data["speed"], SpeedPolicy),
        "top1": (data["quality"]["top1"], Top1Policy),
        "agreement": (data["quality"]["agreement"], AgreementPolicy),
        "kl_mean": (data["quality"]["kl_mean"], KlPolicy),
    }
    for section, (values, model) in parts.items():
        assert set(values) == set(model.model_fields), section
        start = text.index(f"{section}:")
        for field in model.model_fields:
            idx = text.index(f" {field}:", start)
            before = text[:idx].rstrip().splitlines()[-1].strip()
            line = text[idx:].splitlines()[0]
            assert before.startswith("#") or "#" in line or field == "baseline", field


def test_policy_file_overrides_and_label(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        "version: 2\nconfidence: 0.9\nspeed:\n  min_speedup: 1.2\n  batches: [1]\n"
        "quality:\n  agreement:\n    min: 0.99\n"
    )
    policy, label = load_policy(f)
    assert label == str(f)
    assert policy.confidence == 0.9
    assert policy.speed.batches == [1]
    assert policy.quality.agreement.min == 0.99
    assert policy.quality.kl_mean.max == 0.02  # untouched keys keep the default


def test_version_1_file_keeps_its_limits_against_fp32(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(
        "version: 1\nspeed:\n  min_speedup: 1.1\n  q1_speedup_above: 1.0\nquality:\n"
        "  top1_change_ci_low_above: -0.01\n  min_agreement: 0.98\n  max_kl_mean: 0.03\n"
    )
    policy, _ = load_policy(f)
    q = policy.quality
    assert policy.speed.min_speedup == 1.1
    assert (q.top1.baseline, q.top1.margin_points) == (Baseline.FP32, 1.0)
    assert (q.agreement.baseline, q.agreement.min) == (Baseline.FP32, 0.98)
    assert (q.kl_mean.baseline, q.kl_mean.max) == (Baseline.FP32, 0.03)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("quality:\n  top1:\n    baseline: int8\n", "quality.top1.baseline: Input should be"),
        ("quality:\n  kl_mean:\n    baseline: bf16\n", "quality.kl_mean.baseline"),
        ("confidence: 1.0\n", "confidence: must lie strictly between 0 and 1"),
        ("confidence: 0\n", "confidence: must lie strictly between 0 and 1"),
        ("confidence: 95\n", "confidence: must lie strictly between 0 and 1"),
        ("quality:\n  top1:\n    margin_points: -0.5\n", "quality.top1.margin_points"),
        ("speed:\n  min_sped: 1.1\n", "speed.min_sped: unknown key"),
        ("speed:\n  min_speedup: 0.9\n", "speed.min_speedup"),
        ("quality:\n  agreement:\n    min: 1.5\n", "quality.agreement.min"),
        ("quality:\n  kl_mean:\n    max: -1\n", "quality.kl_mean.max"),
        ("speed:\n  batches: [1, 1]\n", "speed.batches"),
        ("version: 3\n", "version"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("speed: [1.05\n", "malformed YAML"),
    ],
)
def test_bad_policy_file_is_one_clear_line(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as err:
        load_policy(f)
    message = str(err.value)
    assert needle in message
    assert str(f) in message
    assert "\n" not in message


def test_negative_margin_says_how_to_write_it(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("quality:\n  top1:\n    margin_points: -0.5\n")
    with pytest.raises(UserError, match=r"0\.5 allows a 0\.5-point loss"):
        load_policy(f)


def test_unknown_preset_or_missing_file(tmp_path):
    with pytest.raises(UserError, match="neither a file nor a preset"):
        load_policy(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="strict"):
        load_policy("stricter")


def test_unknown_compile_mode_in_policy_is_refused():
    with pytest.raises(ValidationError):
        Policy(speed={"compile_mode": "reduce-overhead"})


# --- verdicts -----------------------------------------------------------------------------


def test_ships_when_every_gate_passes(ship_record):
    d = _decide(ship_record)
    assert d.outcome == Outcome.SHIP and d.ship and bool(d)
    assert d.failed == [] and d.inconclusive == []
    names = [g.name for g in d.gates]
    assert names == [
        "speed at batch 1",
        "speed at batch 32",
        "speed at batch 128",
        "top-1 change",
        "top-1 agreement",
        "KL mean",
        "no NaN/Inf",
    ]
    assert d.confidence == 0.95 and d.policy == "builtin:default"


def test_speed_gate_holds_the_rounds_quartiles(ship_record):
    d = _decide(ship_record)
    bs = next(b for b in ship_record.speed.batches if b.batch == 32)
    g = _gate(d, "speed at batch 32")
    assert (g.value, g.low, g.high) == (bs.ratio.median, bs.ratio.q1, bs.ratio.q3)
    assert (g.threshold, g.batch, g.status) == (1.05, 32, GateStatus.PASS)


def test_speed_quartiles_straddling_the_threshold_are_inconclusive():
    record = build_record(
        speedup={1: 1.12, 32: 1.05, 128: 1.10}, noise=0.02, outcomes=GOOD_FP8, with_decision=False
    )
    b32 = next(b for b in record.speed.batches if b.batch == 32).ratio
    assert b32.q1 < 1.05 < b32.q3  # the construction holds
    d = _decide(record)
    assert d.outcome == Outcome.INCONCLUSIVE and not bool(d)
    assert d.inconclusive == ["speed at batch 32"]
    g = _gate(d, "speed at batch 32")
    assert g.missing is None and g.images_needed is None


def test_speed_wholly_under_the_threshold_fails():
    record = build_record(
        speedup={1: 1.12, 32: 0.9, 128: 1.10}, outcomes=GOOD_FP8, with_decision=False
    )
    d = _decide(record)
    assert d.outcome == Outcome.NOT_SHIP
    assert d.failed == ["speed at batch 32"]
    assert _decide(record, Policy(speed={"batches": [1, 128]})).ship


def test_clearly_worse_quality_is_not_ship():
    # 5 gained, 5 lost, 51 moved between wrong classes: agreement 95.93% on 1500 images
    record = build_record(speedup=FAST, outcomes={"fp8": (5, 5, 51, 0.012)}, with_decision=False)
    d = _decide(record)
    assert d.outcome == Outcome.NOT_SHIP
    assert d.failed == ["top-1 agreement"]
    g = _gate(d, "top-1 agreement")
    assert g.high < 0.97 and g.value == pytest.approx(1 - 61 / 1500)


def test_kl_wholly_above_the_limit_fails():
    record = build_record(speedup=FAST, outcomes={"fp8": (5, 4, 1, 0.031)}, with_decision=False)
    assert _decide(record).failed == ["KL mean"]


def test_top1_loss_against_fp16_beyond_the_margin_fails():
    record = build_record(
        speedup=FAST,
        outcomes=GOOD_FP8,
        against_fp16=(2, 60, 0, 0.004),
        with_decision=False,
    )
    d = _decide(record)
    assert d.failed == ["top-1 change"]
    g = _gate(d, "top-1 change")
    assert g.baseline == Baseline.FP16 and g.high < -0.005
    # against fp32 the same engine passes: the baseline decides which counts are read
    fp32 = Policy(quality={"top1": {"baseline": "fp32"}})
    assert _gate(_decide(record, fp32), "top-1 change").status == GateStatus.PASS


def test_top1_marginal_is_inconclusive_with_images_needed():
    record = build_record(
        speedup=FAST, outcomes=GOOD_FP8, against_fp16=(8, 14, 0, 0.004), with_decision=False
    )
    d = _decide(record)
    assert d.outcome == Outcome.INCONCLUSIVE
    g = _gate(d, "top-1 change")
    assert g.low < -0.005 < g.high
    assert g.images_needed is not None and g.images_needed > 1500
    assert d.images_needed == g.images_needed


def test_size_alone_never_ships():
    record = build_record(
        speedup={1: 1.0, 32: 0.97, 128: 0.98},
        outcomes=GOOD_FP8,
        fp8_weight_bytes=24_000_000,
        with_decision=False,
    )
    assert record.speed.weight_bytes["fp8"] < record.speed.weight_bytes["fp16"]
    d = _decide(record)
    assert not d.ship
    assert {g.kind for g in d.gates} == {"speed", "quality"}  # no size gate exists


def test_cpu_timings_are_inconclusive_never_ship():
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, device="cpu", with_decision=False)
    d = _decide(record)
    assert d.outcome == Outcome.INCONCLUSIVE
    speed = [g for g in d.gates if g.kind == "speed"]
    assert all(g.missing == Missing.NOT_ON_GPU and g.value is None for g in speed)
    assert all(g.passed for g in d.gates if g.kind == "quality")


def test_absent_sections_are_inconclusive(ship_record):
    d = _decide(ship_record.model_copy(update={"speed": None, "status": "partial"}))
    assert d.outcome == Outcome.INCONCLUSIVE
    assert all(g.missing == Missing.NOT_MEASURED for g in d.gates if g.kind == "speed")
    d = _decide(ship_record.model_copy(update={"quality": None, "status": "partial"}))
    assert d.inconclusive == ["top-1 change", "top-1 agreement", "KL mean", "no NaN/Inf"]


def test_random_weights_never_ship():
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, random_weights=True, with_decision=False)
    d = _decide(record)
    assert d.outcome == Outcome.INCONCLUSIVE
    assert d.inconclusive == ["top-1 change", "top-1 agreement", "KL mean"]
    assert all(_gate(d, n).missing == Missing.RANDOM_WEIGHTS for n in d.inconclusive)
    assert _gate(d, "no NaN/Inf").passed  # still evaluated: NaN is a defect with any weights


def test_unlabelled_data_skips_the_top1_gate_unless_required():
    record = build_record(speedup=FAST, outcomes=GOOD_FP8, labelled=False, with_decision=False)
    d = _decide(record)
    g = _gate(d, "top-1 change")
    assert g.passed and g.missing == Missing.UNLABELLED and g.skipped_reason
    assert d.ship
    d2 = _decide(record, Policy(quality={"top1": {"require_labels": True}}))
    assert d2.outcome == Outcome.INCONCLUSIVE and d2.inconclusive == ["top-1 change"]


def test_nonfinite_output_in_any_engine_fails():
    for engine, name in (("fp8", "extreme_pos_1e4"), ("fp16", "n0/ILSVRC2012_val_1.JPEG")):
        record = build_record(
            speedup=FAST, outcomes=GOOD_FP8, nonfinite={engine: [name]}, with_decision=False
        )
        d = _decide(record)
        assert d.failed == ["no NaN/Inf"] and _gate(d, "no NaN/Inf").value == 1.0


def test_compile_mode_mismatch_is_inconclusive(ship_record):
    assert ship_record.speed.compile_mode == "max-autotune"
    d = _decide(ship_record, Policy(speed={"compile_mode": "default"}))
    assert all(g.missing == Missing.NOT_TIMED for g in d.gates if g.kind == "speed")
    assert _decide(ship_record, Policy(speed={"compile_mode": "max-autotune"})).ship


def test_kl_interval_only_at_recorded_levels(ship_record):
    d = _decide(ship_record, Policy(confidence=0.93))
    g = _gate(d, "KL mean")
    assert g.missing == Missing.NOT_RECORDED and "0.95" in g.skipped_reason


def test_decision_round_trips_through_the_record(ship_record):
    d = _decide(ship_record)
    record = ship_record.model_copy(update={"decision": d})
    again = StudyRecord.model_validate_json(record.model_dump_json())
    assert again.decision == d and bool(again.decision)


def test_exit_codes_are_distinct_and_leave_errors_alone():
    assert EXIT_CODES[Outcome.SHIP] == 0
    codes = set(EXIT_CODES.values())
    assert len(codes) == len(Outcome)
    assert not codes & {1, 2, 130}


# --- the preview before heavy work ----------------------------------------------------------


def test_preview_warns_when_the_margin_cannot_be_met():
    policy, _ = load_policy(None)
    text = heldout_preview(policy, 1300, labelled=True)
    first, warning = text.splitlines()
    assert first.startswith("with 1,300 held-out images the top-1 gate can resolve a loss of")
    assert warning.startswith("warning: the policy's 0.5-point top-1 margin needs about")
    roomy = heldout_preview(policy, 50_000, labelled=True)
    assert "warning" not in roomy
    assert "cannot be evaluated" in heldout_preview(policy, 1300, labelled=False)
