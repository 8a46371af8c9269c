"""`quantstudy import-trt`: trtexec's exports (tests/fixtures/trtexec, in the formats of
NVIDIA/TensorRT samples/common/sampleReporting.cpp) into a TensorRT study, and every way a set of
exports can be wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantstudy.cli import main
from quantstudy.record.load import load_record
from tests.unit._bridge_study import small_study

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "trtexec"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return small_study(tmp_path_factory.mktemp("bridge"))


@pytest.fixture
def exports(tmp_path) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "trt")
    return tmp_path / "trt"


def _import(
    study: Path, exports: Path, out: Path, fp16: str = "fp16", onnx_file: Path | None = None
) -> int:
    onnx_file = onnx_file or study / "tensorrt" / "model.onnx"
    args = ["import-trt", str(study), "--fp16", str(exports / fp16), "--fp8", str(exports / "fp8")]
    return main([*args, "--onnx", str(onnx_file), "--out", str(out)])


def test_fixtures_become_a_tensorrt_study_with_a_decision(study, exports, tmp_path, capsys):
    out = tmp_path / "trt-study"
    code = _import(study, exports, out)
    printed = capsys.readouterr().out
    assert code in (0, 3, 4)  # random weights: the quality gates cannot pass
    assert "TensorRT 10.8.0 on NVIDIA H200" in printed
    assert "FP8 in the engine: 6 of the recipe's 7 FP8 layers" in printed
    assert "not FP8: conv_head (fp16)" in printed
    record = load_record(out / "study.json")
    sp = record.speed
    assert (sp.engine, sp.device, sp.meaningful) == ("tensorrt", "NVIDIA H200", True)
    assert [b.batch for b in sp.batches] == [1, 2]
    b1 = sp.batches[0]
    assert b1.fp16_ms.median == pytest.approx(0.30) and b1.fp8_ms.median == pytest.approx(0.27)
    assert b1.ratio.median == pytest.approx(0.30 / 0.27)
    assert b1.ratio.q1 == pytest.approx(b1.fp16_ms.q1 / b1.fp8_ms.q3)
    assert b1.fp16_ms.n == 12
    assert "conv_head" in b1.warnings[0]
    gates = {g.name: g for g in record.decision.gates if g.kind == "speed"}
    assert all(g.passed for g in gates.values()) and len(gates) == 2
    fp8_groups = {g.group: g for g in sp.kernels[1].groups}  # fp8 engine at batch 1
    assert fp8_groups["fp8_matmul"].count == 6 and fp8_groups["depthwise_conv"].count == 2
    assert {p.layer: p.precision for p in sp.layer_precision}["conv_head"] == "fp16"
    assert (out / "report.md").is_file()
    original = load_record(study / "study.json")
    assert original.speed is None  # the study itself is untouched


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quantstudy: error: ")
    return err[0]


def test_missing_file_is_named(study, exports, tmp_path, capsys):
    (exports / "fp8" / "b2.profile.json").unlink()
    assert _import(study, exports, tmp_path / "o") == 1
    assert "b2.profile.json is missing" in _one_error(capsys)


def test_corrupt_json_is_refused(study, exports, tmp_path, capsys):
    (exports / "fp16" / "b1.times.json").write_text('[{"computeMs": 0.3,')
    assert _import(study, exports, tmp_path / "o") == 1
    assert "b1.times.json is not valid JSON" in _one_error(capsys)


def test_wrong_format_is_refused(study, exports, tmp_path, capsys):
    (exports / "fp16" / "b1.profile.json").write_text(json.dumps([{"name": "x", "timeMs": 1}]))
    assert _import(study, exports, tmp_path / "o") == 1
    assert "not trtexec --exportProfile output" in _one_error(capsys)


@pytest.mark.parametrize(
    ("file", "field", "said"),
    [
        ("b1.times.json", "computeMs", "entry 0 has no finite numeric computeMs"),
        ("b1.times.json", "latencyMs", "entry 0 has no finite numeric computeMs/latencyMs"),
        ("b1.profile.json", "averageMs", "entry 1 has no name and finite averageMs"),
    ],
)
def test_a_time_that_is_not_finite_is_bad_input_not_a_bug(
    study, exports, tmp_path, capsys, file, field, said
):
    path = exports / "fp16" / file
    rows = json.loads(path.read_text())
    rows[1 if "profile" in file else 0][field] = float("nan")
    path.write_text(json.dumps(rows))  # `NaN`, as Python's json writes it
    assert _import(study, exports, tmp_path / "o") == 1
    assert said in _one_error(capsys)
    assert not (tmp_path / "o" / "study.json").exists()


def test_an_input_dimension_that_is_no_batch_is_refused(study, exports, tmp_path, capsys):
    path = exports / "fp16" / "b1.layers.json"
    layers = json.loads(path.read_text())
    for layer in layers["Layers"]:
        for tensor in layer.get("Inputs", []):
            if tensor["Name"] == "input":
                tensor["Dimensions"][0] = float("nan")
    path.write_text(json.dumps(layers))
    assert _import(study, exports, tmp_path / "o") == 1
    assert "name no batch" in _one_error(capsys)


def test_wrong_batch_is_refused(study, exports, tmp_path, capsys):
    for kind in ("times", "profile", "layers", "log"):
        ext = "log" if kind == "log" else f"{kind}.json"
        shutil.copy(exports / "fp8" / f"b1.{ext}", exports / "fp8" / f"b2.{ext}")
    assert _import(study, exports, tmp_path / "o") == 1
    assert "at batch 1, not 2" in _one_error(capsys)


def test_fp8_engine_of_another_model_is_refused(study, exports, tmp_path, capsys):
    for b in (1, 2):
        path = exports / "fp8" / f"b{b}.layers.json"
        path.write_text(path.read_text().replace("/blocks/", "/stages/").replace("conv_head", "x"))
    assert _import(study, exports, tmp_path / "o") == 1
    assert "from another model" in _one_error(capsys)


def test_fp8_exports_given_as_fp16_are_refused(study, exports, tmp_path, capsys):
    assert _import(study, exports, tmp_path / "o", fp16="fp8") == 1
    assert "holds FP8 layers" in _one_error(capsys)


def test_batches_must_match_between_engines(study, exports, tmp_path, capsys):
    for p in (exports / "fp16").glob("b2.*"):
        p.unlink()
    assert _import(study, exports, tmp_path / "o") == 1
    assert "same batch sizes" in _one_error(capsys)


def test_layer_names_only_is_refused(study, exports, tmp_path, capsys):
    path = exports / "fp8" / "b1.layers.json"
    path.write_text(json.dumps({"Layers": ["a + b", "c"], "Bindings": ["input", "logits"]}))
    assert _import(study, exports, tmp_path / "o") == 1
    assert "--profilingVerbosity=detailed" in _one_error(capsys)


def test_onnx_of_another_study_is_refused(study, exports, tmp_path, capsys):
    import onnx

    model = onnx.load(study / "tensorrt" / "model.onnx")
    for p in model.metadata_props:
        if p.key == "quantstudy.recipe_sha256":
            p.value = "0" * 64
    other = tmp_path / "other.onnx"
    onnx.save(model, other)
    assert _import(study, exports, tmp_path / "o", onnx_file=other) == 1
    assert "not this study's" in _one_error(capsys)


def test_a_study_without_a_recipe_is_refused_in_one_line(study, exports, tmp_path, capsys):
    """A study that stopped before its recipe, given an ONNX that names no recipe either, is
    refused with a clean error, not a traceback."""
    import onnx

    from quantstudy.record.io import write_record

    partial = tmp_path / "partial"
    shutil.copytree(study, partial)
    record = load_record(partial / "study.json")
    write_record(partial / "study.json", record.model_copy(update={"recipe": None}))
    model = onnx.load(study / "tensorrt" / "model.onnx")
    kept = [p for p in model.metadata_props if p.key != "quantstudy.recipe_sha256"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    bare = tmp_path / "bare.onnx"
    onnx.save(model, bare)
    assert _import(partial, exports, tmp_path / "o", onnx_file=bare) == 1
    assert "has no recipe section" in _one_error(capsys)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1e308, "entry 0 has computeMs 1e+308; a GPU inference takes 0.0001 to 1e+06 ms"),
        (1e-320, "entry 0 has computeMs 9.99989e-321; a GPU inference takes 0.0001 to 1e+06"),
        (0.0, "entry 0 has computeMs 0; a GPU inference takes"),
    ],
)
def test_an_implausible_time_is_refused_before_a_ratio_is_taken(
    study, exports, tmp_path, capsys, value, said
):
    """1e-320 ms made x infinite and passed the speed gate; 1e308 ms overflowed the plots."""
    path = exports / "fp8" / "b1.times.json"
    rows = json.loads(path.read_text())
    rows[0]["computeMs"] = value
    path.write_text(json.dumps(rows))
    assert _import(study, exports, tmp_path / "o") == 1
    assert said in _one_error(capsys)
    assert not (tmp_path / "o" / "study.json").exists()


def test_an_export_that_is_a_pipe_is_refused_unopened(study, exports, tmp_path, capsys):
    import os

    path = exports / "fp16" / "b1.times.json"
    path.unlink()
    os.mkfifo(path)  # opened, it would wait for a writer
    assert _import(study, exports, tmp_path / "o") == 1
    assert f"{path}: it is a named pipe, not a file" in _one_error(capsys)


def test_a_relative_policy_path_of_a_record_is_refused_not_read_from_here(
    study, exports, tmp_path, capsys, monkeypatch
):
    """A decision recorded with a relative policy file (before labels were absolute): another
    file of that name in this folder must not decide the TensorRT study."""
    copy = tmp_path / "study"
    shutil.copytree(study, copy)
    record = json.loads((copy / "study.json").read_text())
    record["decision"]["policy"] = "mine.yaml"  # the decision is outside the seal
    (copy / "study.json").write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("version: 1\nspeed:\n  min_speedup: 1.01\n")
    assert _import(copy, exports, tmp_path / "o", onnx_file=study / "tensorrt" / "model.onnx") == 1
    assert "policy file mine.yaml, a path relative to" in _one_error(capsys)
    assert not (tmp_path / "o" / "study.json").exists()


def test_a_policy_file_is_recorded_by_its_absolute_path(tmp_path, monkeypatch):
    from quantstudy.decision.policy import load_policy

    (tmp_path / "mine.yaml").write_text("version: 1\n")
    monkeypatch.chdir(tmp_path)
    _, label = load_policy("mine.yaml")
    assert label == str(tmp_path / "mine.yaml")
