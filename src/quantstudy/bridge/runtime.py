"""Whether the installed onnxruntime runs the FP8 Q/DQ graph `export --check` will run.

Why a probe: onnxruntime releases differ in which QuantizeLinear/DequantizeLinear type
combinations their CPU kernels take, and a missing one shows only at run time, deep in the
check, as a traceback. An fp16 graph that keeps float32 scales (opset 23's mixed types, the
default export) loads in onnxruntime 1.30 and 1.31.1 and then fails inside QuantizeLinear
("Tensor type mismatch ... MLFloat16"); 1.32.0 runs it (docs/versions.json). So before the
check exports anything, one two-node graph of the same float type, scale type and opset is run
once; a refusal is one line that names the onnxruntime needed.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from quantstudy.bridge.check import DISABLED_OPTIMIZERS
from quantstudy.bridge.qdq import FP8_QDQ_OPSET, MIXED_SCALE_OPSET, PRECISIONS, min_ir_version
from quantstudy.record.errors import UserError

# The first onnxruntime seen to run an fp16 graph's FP8 Q/DQ with float32 scales (the default
# export), and so the floor the `onnx` extra declares.
ORT_FOR_MIXED_SCALES = "1.32"
ORT_ERRORS = tuple(
    getattr(ort_state, name)
    for name in ("Fail", "InvalidArgument", "InvalidGraph", "NotImplemented", "RuntimeException")
    if hasattr(ort_state, name)
)
_NUMPY = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _pair_graph(float_type: int, scale_fp32: bool, opset: int) -> onnx.ModelProto:
    """x -> QuantizeLinear (FP8 E4M3, saturating) -> DequantizeLinear, as the export writes it."""
    scale_type = TensorProto.FLOAT if scale_fp32 else float_type
    x = helper.make_tensor_value_info("x", float_type, [1, 4])
    y = helper.make_tensor_value_info("y", float_type, [1, 4])
    scale = numpy_helper.from_array(np.array(0.5, _NUMPY[scale_type]), "s")
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0])
    extra = {"output_dtype": float_type} if scale_type != float_type else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **extra),
    ]
    graph = helper.make_graph(nodes, "fp8_pair", [x], [y], [scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min_ir_version(model)
    return model


@functools.cache
def refusal(precision: str, opset: int) -> str | None:
    """onnxruntime's first error line on a Q/DQ pair as the export writes it at `precision`
    and `opset`, or None when it runs and returns the pair's exact values."""
    float_type = PRECISIONS[precision][1]
    model = _pair_graph(float_type, precision == "fp32" or opset >= MIXED_SCALE_OPSET, opset)
    x = np.array([[-1.0, 0.5, 1.5, 3.0]], dtype=_NUMPY[float_type])
    options = ort.SessionOptions()  # as `check.session` runs graphs, without its error log
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 4
    try:
        sess = ort.InferenceSession(
            model.SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=DISABLED_OPTIMIZERS,
        )
        (y,) = sess.run(None, {"x": x})
    except ORT_ERRORS as e:
        message = str(e).splitlines()[0]
        return message.rsplit("Status Message: ", 1)[-1].rsplit("/", 1)[-1][:160]
    if not np.array_equal(y, x):  # each value is exact in FP8 at scale 0.5
        return f"the pair returned {y.tolist()} for {x.tolist()}"
    return None


def require_runtime(precision: str, opset: int) -> None:
    """Refuse, before anything is exported, a check this onnxruntime cannot run: the graph at
    `precision` and `opset`, and for fp16 its fp32 twin (opset 19) that the check also runs."""
    if precision not in PRECISIONS or not FP8_QDQ_OPSET <= opset <= onnx.defs.onnx_opset_version():
        return  # `qdq.build_qdq` refuses these in its own line
    graphs = [(precision, opset)]
    if precision != "fp32":
        graphs.append(("fp32", FP8_QDQ_OPSET))
    for p, o in graphs:
        why = refusal(p, o)
        if why is None:
            continue
        said = f"export --check: onnxruntime {ort.__version__} cannot run the {p} FP8 Q/DQ graph"
        if (
            p != "fp32"
            and o >= MIXED_SCALE_OPSET
            and _version(ort.__version__) < _version(ORT_FOR_MIXED_SCALES)
        ):
            raise UserError(
                f"{said} at opset {o} ({why}); the check needs onnxruntime>="
                f"{ORT_FOR_MIXED_SCALES} (or export with --opset 19, fp16 scales)"
            )
        # an onnxruntime new enough for the scales that lacks the opset: a lower one it runs
        runs = next((q for q in range(o - 1, FP8_QDQ_OPSET - 1, -1) if refusal(p, q) is None), None)
        fix = f"export with --opset {runs}, the newest it runs, or " if runs else ""
        raise UserError(f"{said} at opset {o} ({why}); {fix}install an onnxruntime that does")


def _version(text: str) -> tuple[int, ...]:
    """The release numbers of a version (`1.32.0rc1` -> (1, 32, 0))."""
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split(".")[:3])
