"""The committed example studies: schema round trip, deterministic re-render, self-check."""

import json
import shutil
from pathlib import Path

import pytest

from quantstudy.record import SCHEMA_VERSION, StudyRecord
from quantstudy.record.load import load_record
from quantstudy.report.render import render_study
from quantstudy.report.selfcheck import check_markdown

ROOT = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.committed("examples")
EXAMPLES = sorted(ROOT.glob("**/study.json"))
VERSION_1 = [p for p in EXAMPLES if json.loads(p.read_text())["schema_version"] == 1]


def _id(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


NEW_IN_VERSION_2 = {"sensitivity", "layer_speed", "search"}
NEW_IN_VERSION_2_VARIANT = {"predicted", "measured"}
NEW_IN_VERSION_3_ENGINE = {"fp8_kernel": None, "fp8_epilogue": {}}
NEW_IN_VERSION_4_ENGINE = {"fp8_handoff": {}}
NEW_IN_VERSION_5_ENGINE = {"fp8_scaled_mm_output": None}
NEW_IN_VERSION_6_ENGINE = {"fp8_kernel_choice": None}
NEW_IN_VERSION_8_ENGINE = {"fp8_residual": {}, "fp8_sum_handoff": {}}
NEW_IN_VERSION_12_ENGINE = {"fp8_padded_output": {}}
NEW_IN_VERSION_16_ENGINE = {"fp8_rewrites_skipped": {}}
NEW_IN_VERSION_17_ENGINE = {"fp8_stepped_aside": []}
NEW_IN_VERSION_27_ENGINE = {"fp8_gelu": {}}
NEW_IN_VERSION_6_CONFIG = {
    "class_list": None,
    "strip_prefix": None,
    "eval_batch": 64,
    "speed": True,
    "package": False,
    "out": None,
    "float32_engine": False,  # schema 12
    "quality": True,  # schema 16
}
NEW_IN_VERSION_16_MODEL = {"macs": None}


NEW_IN_VERSION_6_RECORD = {"timings", "digest"}
NEW_IN_VERSION_14_RECORD = {"sequential", "per_image"}
NEW_IN_VERSION_6_RECIPE = {
    "rounding": "nearest",
    "activation_granularity": "per_tensor",
    "layer_calibrators": {},
    "migration": "none",
    "migration_alpha": None,
    "propagated": False,  # schema 7 (as `sequential` until 26)
    "tune": "none",  # schema 9
    "tune_epochs": None,
    "per_row_max_channels": None,  # schema 10
    "scale_candidates": 1,  # schema 11
    "refine_sweeps": 0,
    "headroom": 1.0,
    "gelu": "any",  # schema 27
}


def _without_version_3(full: dict) -> dict:
    """The full dump less the version-3 to -16 keys, after checking they hold their empty
    defaults."""
    out = dict(full)
    for key in NEW_IN_VERSION_6_RECORD | NEW_IN_VERSION_14_RECORD:
        assert out.pop(key) is None
    environment = dict(out["environment"])
    assert environment.pop("lab_switches") is None  # schema 20
    assert environment.pop("triton") is None  # schema 25
    out["environment"] = environment
    data = dict(out["data"])
    assert data.pop("extended") == []  # schema 14: images added by `quantstudy extend`
    out["data"] = data
    config = dict(out["config"])
    assert config.pop("fp8_kernel") is None
    assert config.pop("fp8_accumulate") is None  # schema 20
    for key, default in NEW_IN_VERSION_6_CONFIG.items():
        assert config.pop(key) == default
    model = dict(out["model"])
    for key, empty in NEW_IN_VERSION_16_MODEL.items():
        assert model.pop(key) == empty
    out["model"] = model
    recipe = dict(out["recipe"])
    assert recipe.pop("bias_correction") is False
    for key, default in NEW_IN_VERSION_6_RECIPE.items():
        assert recipe.pop(key) == default
    engines = []
    for engine in out["engines"]:
        engine = dict(engine)
        added = (
            NEW_IN_VERSION_3_ENGINE
            | NEW_IN_VERSION_4_ENGINE
            | NEW_IN_VERSION_5_ENGINE
            | NEW_IN_VERSION_6_ENGINE
            | NEW_IN_VERSION_8_ENGINE
            | NEW_IN_VERSION_12_ENGINE
            | NEW_IN_VERSION_16_ENGINE
            | NEW_IN_VERSION_17_ENGINE
            | NEW_IN_VERSION_27_ENGINE
        )
        for key, empty in added.items():
            assert engine.pop(key) == empty
        engines.append(engine)
    calibration = dict(out["calibration"])
    tensors = []
    for t in calibration["tensors"]:
        t = dict(t)
        assert t.pop("channel_mean") is None
        assert t.pop("calibrator") is None
        tensors.append(t)
    calibration["tensors"] = tensors
    speed = dict(out["speed"])
    for key in ("ideal", "layer_precision", "engine", "engine_version"):  # schema 6
        assert speed.pop(key) is None
    quality = dict(out["quality"])
    assert quality.pop("against_fp16") is None
    quality["engines"] = [dict(e) for e in quality["engines"]]
    for e in quality["engines"]:
        assert e.pop("kl_mean_intervals") is None
    if quality["emulation_gap"] is not None:  # schema 12: the split against fp32
        gap = dict(quality["emulation_gap"])
        split = ("engine_only_differ", "emulation_only_differ", "split_mcnemar_p")
        split += ("float32_agreement", "float32_differ_count", "float32_kl_mean")
        split += tuple(f"half_floor_{k}" for k in ("dtype", "agreement", "differ_count", "kl_mean"))
        split += ("floor_only_differ", "floor_emulation_only_differ", "floor_split_mcnemar_p")
        for key in split:  # the last four: schema 13
            assert gap.pop(key) is None
        quality["emulation_gap"] = gap
    return out | {
        "speed": speed,
        "quality": quality,
        "config": config,
        "recipe": recipe,
        "engines": engines,
        "calibration": calibration,
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_study_json_round_trips_its_schema(path):
    raw = json.loads(path.read_text())
    record = StudyRecord.model_validate(raw)
    # old files still load and keep their version
    assert raw["schema_version"] <= SCHEMA_VERSION
    assert record.schema_version == raw["schema_version"]
    assert record.model_dump(mode="json", exclude_unset=True) == raw


@pytest.mark.parametrize("path", VERSION_1, ids=_id)
def test_version_1_file_gains_only_empty_keys(path):
    raw = json.loads(path.read_text())
    record = StudyRecord.model_validate(raw)
    # in full, the dump differs from the file only by the keys added since, all empty
    full = _without_version_3(record.model_dump(mode="json"))
    assert set(full) - set(raw) == NEW_IN_VERSION_2
    assert all(full[k] is None for k in NEW_IN_VERSION_2)
    assert {k: v for k, v in full.items() if k in raw and k != "variants"} == {
        k: v for k, v in raw.items() if k != "variants"
    }
    for var, raw_var in zip(full["variants"], raw["variants"], strict=True):
        assert set(var) - set(raw_var) == NEW_IN_VERSION_2_VARIANT
        assert {k: v for k, v in var.items() if k in raw_var} == raw_var


@pytest.mark.parametrize("path", VERSION_1, ids=_id)
def test_version_1_file_loads_for_the_report(path):
    record = load_record(path)
    assert record.schema_version == 1
    assert record.sensitivity is None and record.layer_speed is None and record.search is None


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_committed_report_is_what_the_record_renders(path, tmp_path):
    shutil.copy(path, tmp_path / "study.json")
    md = render_study(tmp_path).read_text()
    assert md == (path.parent / "report.md").read_text()
    assert check_markdown(md, StudyRecord.model_validate_json(path.read_text())) == []


def test_examples_are_present():
    names = {p.parent.name for p in EXAMPLES}
    assert {"mobilenetv4_conv_large-random-h200", "tf_efficientnet_lite0-h200"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_every_example_is_decided_again_under_typed_gates(path):
    """Examples older than the three-outcome decision were decided again from their recorded
    measurements (`quantstudy decide`), and their reports say so."""
    record = StudyRecord.model_validate_json(path.read_text())
    d = record.decision
    assert d is not None
    assert all(g.metric is not None and g.measured is None for g in d.gates)
    if record.schema_version < 6:
        assert d.redecided is not None
        assert d.redecided.previous_outcome == "not_ship"  # what each study said at the time
        report = (path.parent / "report.md").read_text()
        assert "This decision was taken again by quantstudy" in report
