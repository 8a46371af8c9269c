"""`quantstudy export`: the Q/DQ ONNX of a real small study, its checks, and the opset rules."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from quantstudy.bridge.check import CheckResult, check_structure, run_onnx, session
from quantstudy.bridge.export import Exported, check_export, export_study
from quantstudy.bridge.qdq import min_ir_version
from quantstudy.cli import main
from quantstudy.quant.formats.fp8 import fake_quant
from quantstudy.record.errors import UserError
from quantstudy.record.load import load_record
from tests.unit._bridge_study import small_study

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return small_study(tmp_path_factory.mktemp("bridge"))


def test_export_check_passes_and_writes_the_trtexec_script(study, capsys):
    from quantstudy.bridge.runtime import ORT_FOR_MIXED_SCALES, refusal

    if refusal("fp16", 23) is not None:  # the refusal: test_check_refuses_an_onnxruntime_...
        pytest.skip(f"fp16 Q/DQ with float32 scales needs onnxruntime>={ORT_FOR_MIXED_SCALES}")
    assert main(["export", str(study), "--check"]) == 0
    out = capsys.readouterr().out
    assert "check passed" in out and "[FAIL]" not in out
    assert "[pass] rebuild = study" in out  # the study ran on this CPU: its floor is reproduced
    assert "7 FP8 layers, 7 Q/DQ pairs, fp16 graph, opset 23, scales float32" in out
    script = (study / "tensorrt" / "trtexec.sh").read_text()
    for b in (1, 2):
        assert f"--shapes=input:{b}x3x160x160" in script
    assert script.count("--stronglyTyped") == 4  # fp16 and FP8 engine at each batch
    for flag in ("--useCudaGraph", "--exportTimes=", "--exportProfile=", "--exportLayerInfo="):
        assert script.count(flag) == 4
    assert "--profilingVerbosity=detailed" in script


def test_graph_holds_the_studys_scales_and_fp8_weights(study):
    record = load_record(study / "study.json")
    model = onnx.load(study / "tensorrt" / "model.onnx")
    inits = {i.name: i for i in model.graph.initializer}
    for t in record.calibration.tensors:
        key = t.tensor.removesuffix(":input")
        assert numpy_helper.to_array(inits[f"{key}.input_scale"]) == np.float32(t.scale)
        zero = inits[f"{key}.input_zero_point"]
        assert zero.data_type == TensorProto.FLOAT8E4M3FN
    for d in record.recipe.selected:
        assert inits[f"{d.name}.weight_fp8"].data_type == TensorProto.FLOAT8E4M3FN
        assert f"{d.name}.weight" not in inits  # the float weight is gone
    quants = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(quants) == len(record.calibration.tensors)
    assert all(a.i == 1 for n in quants for a in n.attribute if a.name == "saturate")
    weight_dq = [n for n in model.graph.node if n.name.endswith("/weight_dequantize")]
    assert {a.i for n in weight_dq for a in n.attribute if a.name == "axis"} == {0}
    float_model = onnx.load(study / "tensorrt" / "model.float.onnx")
    assert not [n for n in float_model.graph.node if "Quantize" in n.op_type]


def test_a_wrong_scale_fails_the_check(study, tmp_path):
    record = load_record(study / "study.json")
    exported = export_study(study, tmp_path / "model.onnx", precision="fp32")
    model = onnx.load(exported.qdq_path)
    key = record.calibration.tensors[-1].tensor.removesuffix(":input")
    init = next(i for i in model.graph.initializer if i.name == f"{key}.input_scale")
    wrong = (numpy_helper.to_array(init) / 16).astype(np.float32)  # numpy 1.x: float64
    init.CopyFrom(numpy_helper.from_array(wrong, init.name))
    onnx.save(model, exported.qdq_path)
    result, _ = check_export(exported)
    failed = {f.name for f in result.findings if not f.passed}
    assert not result
    assert failed == {"input scales = study's", "ONNX vs fake-quant"}


def test_structure_check_catches_a_missing_quantizer(study):
    record = load_record(study / "study.json")
    model = onnx.load(study / "tensorrt" / "model.onnx")
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    model.graph.node.remove(q)
    result = CheckResult()
    check_structure(model, record, result)
    failed = {f.name for f in result.findings if not f.passed}
    assert {"onnx.checker", "Q/DQ pairs"} <= failed


def _relu_fp8_graph() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    scale = numpy_helper.from_array(np.asarray(0.01, dtype=np.float32), "s")
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True)
    nodes = [
        helper.make_node("Relu", ["input"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], saturate=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "relu_fp8", [x], [y], [scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = min_ir_version(model)  # as the export writes it: onnxruntime 1.30 reads it
    return model


def test_relu_in_front_of_fp8_quantize_is_kept():
    """onnxruntime's full optimizer fuses a ReLU into the FP8 QuantizeLinear after it (right for
    uint8, wrong for signed FP8); the check's session must give the ReLU's answer."""
    model = _relu_fp8_graph()
    x = torch.tensor([[-1.0, -0.5, 0.5, 2.0]])
    expected = fake_quant(torch.relu(x), torch.tensor(0.01))  # [0, 0, 0.48, 1.92]
    assert torch.equal(run_onnx(model, x), expected)
    assert session(model).get_session_options().graph_optimization_level.name == "ORT_ENABLE_BASIC"


def test_opset_and_precision_rules(study, tmp_path):
    fp32 = export_study(study, tmp_path / "a.onnx", precision="fp32")
    assert (fp32.graph.opset, fp32.graph.scale_dtype) == (19, "float32")
    fp16_19 = export_study(study, tmp_path / "b.onnx", precision="fp16", opset=19)
    assert fp16_19.graph.scale_dtype == "float16"
    assert 0 < fp16_19.graph.max_scale_rounding <= 2**-11  # fp16 keeps 11 significant bits
    with pytest.raises(UserError, match="opset 19 or newer"):
        export_study(study, tmp_path / "c.onnx", opset=17)
    with pytest.raises(UserError, match=r"\.onnx"):
        export_study(study, tmp_path / "d.txt")


def test_a_study_that_kept_layers_in_fp16_is_refused(study):
    """A "fastest" study whose FP8 engine kept selected layers in fp16 did not measure the
    all-Q/DQ graph the export writes: refused in one line, before anything is rebuilt."""
    from quantstudy.bridge.export import refuse_stepped_aside
    from quantstudy.record import LayerKernel, StudyRecord

    record = load_record(study / "study.json")
    refuse_stepped_aside(record)  # the study as run: nothing stepped aside
    data = record.model_dump(mode="json")
    fp8 = next(e for e in data["engines"] if e["name"] == "fp8")
    layer = fp8["fp8_real"].pop(0)
    row = LayerKernel(name=layer, kernel="fp16", fused_us=2.0, fp16_us=1.0, batch=1)
    fp8 |= {"fp8_kernel_choice": [row.model_dump(mode="json")], "fp8_stepped_aside": [layer]}
    with pytest.raises(UserError, match=f"kept 1 selected layers in fp16 .* first: {layer}"):
        refuse_stepped_aside(StudyRecord.model_validate(data))


def test_missing_data_folder_is_a_clean_error(study, tmp_path, capsys):
    # opset 19 (fp16 scales): a graph every supported onnxruntime runs, so the data is what fails
    args = ["export", str(study), "--check", "--opset", "19", "--out", str(tmp_path / "m.onnx")]
    code = main([*args, "--data", str(tmp_path / "nope")])
    assert code == 1
    assert "not a folder here" in capsys.readouterr().err


def test_exported_dataclass_is_what_check_reads(study):
    assert {f for f in Exported.__dataclass_fields__} >= {"qdq_path", "graph", "rebuilt"}


def test_graphs_carry_the_lowest_ir_version_their_opset_needs(study, tmp_path):
    """The onnx package stamps its newest IR version (14 in onnx 1.23), which onnxruntime 1.30
    refuses; opset 23 needs IR 11 and opset 19 IR 9 (onnx's version table)."""
    for precision, opset, ir in (("fp16", 23, 11), ("fp32", 19, 9)):
        exported = export_study(study, tmp_path / f"{precision}.onnx", precision=precision)
        for path in (exported.qdq_path, exported.float_path):
            model = onnx.load(path)
            assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
            assert model.ir_version == ir


def test_runtime_probe_matches_the_recorded_onnxruntime_floor():
    """fp32 Q/DQ at opset 19 ran on every onnxruntime tried (1.18 to 1.32); the fp16 graph with
    float32 scales runs from 1.32 on (docs/versions.json): the probe must agree here."""
    import onnxruntime as ort

    from quantstudy.bridge import runtime

    assert runtime.refusal("fp32", 19) is None
    assert runtime.refusal("fp16", 19) is None
    major_minor = tuple(int(p) for p in ort.__version__.split(".")[:2])
    floor = tuple(int(p) for p in runtime.ORT_FOR_MIXED_SCALES.split("."))
    assert (runtime.refusal("fp16", 23) is None) == (major_minor >= floor)


def test_check_refuses_an_onnxruntime_that_cannot_run_the_graph(
    study, tmp_path, monkeypatch, capsys
):
    """Before anything is exported: one line naming the onnxruntime needed, no file written."""
    from quantstudy.bridge import runtime

    monkeypatch.setattr(
        runtime, "refusal", lambda p, o: "Tensor type mismatch" if o == 23 else None
    )
    monkeypatch.setattr(runtime.ort, "__version__", "1.30.0")  # before the recorded floor
    out = tmp_path / "x.onnx"
    assert main(["export", str(study), "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "onnxruntime>=1.32" in err and "opset 23" in err
    assert not out.exists() and not (tmp_path / "trtexec.sh").exists()


def test_an_opset_the_installed_onnxruntime_lacks_names_one_it_runs(monkeypatch):
    """An onnxruntime at the floor or newer that lacks the opset: the advice is an opset it runs
    (probed), never to install the onnxruntime that is installed."""
    import onnx

    from quantstudy.bridge import runtime
    from quantstudy.record.errors import UserError

    # the newest opset the installed onnx knows (23 at the floor, onnx 1.18): require_runtime
    # leaves a newer one to build_qdq's own refusal, so the test asks at that opset
    top = onnx.defs.onnx_opset_version()
    monkeypatch.setattr(runtime, "refusal", lambda p, o: "NOT_IMPLEMENTED" if o > top - 2 else None)
    monkeypatch.setattr(runtime.ort, "__version__", runtime.ORT_FOR_MIXED_SCALES + ".0")
    with pytest.raises(UserError) as said:
        runtime.require_runtime("fp16", top)
    line = str(said.value)
    assert f"at opset {top}" in line and f"--opset {top - 2}, the newest it runs" in line
    assert f">={runtime.ORT_FOR_MIXED_SCALES}" not in line


def test_check_at_opset_19_passes_on_every_supported_onnxruntime(study, tmp_path, capsys):
    """fp16 scales at opset 19: the graph an onnxruntime older than 1.32 can check."""
    out = tmp_path / "o19.onnx"
    assert main(["export", str(study), "--check", "--opset", "19", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "check passed" in text and "opset 19, scales float16" in text
