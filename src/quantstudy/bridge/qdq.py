"""The study's recipe as an explicitly quantized ONNX graph (FP8 E4M3 Q/DQ).

The float graph comes from `torch.onnx.export` (TorchScript exporter: no onnxscript needed) of
the deployed float model, BatchNorm already folded as the study folded it. Q/DQ nodes are then
placed with the `onnx` package exactly where the study's engines quantize:

- every FP8 layer's weight is stored as FLOAT8E4M3FN (rounded by the study's own
  `quantize_weight`, from the float32 folded weight) behind a DequantizeLinear with the study's
  weight scale, per output channel on axis 0 (or one scale per tensor);
- every input tensor of FP8 layers goes through one QuantizeLinear/DequantizeLinear pair with
  the study's calibrated scale, zero point 0 of type float8e4m3fn, saturating; layers that share
  an input tensor (one `TensorScale` with several consumers) share that one pair;
- nothing else is quantized.

Opset: FP8 QuantizeLinear/DequantizeLinear exist from opset 19, where the scale must have the
type of the quantized input. An fp32 graph keeps the study's float32 scales at opset 19. An fp16
graph with float32 scales needs opset 23 (QuantizeLinear's scale type T2 and DequantizeLinear's
`output_dtype`); at opset 19 to 22 an fp16 graph stores its scales in fp16, which rounds them
(the export says by how much). TensorRT's parser reads opset 9 to 20 in 10.0 (onnx-tensorrt's
operator list, https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md, at its 10.1
release) and up to 25 in 11.x (TensorRT ONNX opset guide), with
FP8 Q/DQ from 9.2 on.
"""

from __future__ import annotations

import copy
import io
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from quantstudy.bridge.rebuild import Rebuilt, recipe_and_calibration
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant.formats.fp8 import E4M3_MAX, quantize_weight
from quantstudy.record.errors import UserError

FP8_QDQ_OPSET = 19  # first opset with float8 QuantizeLinear/DequantizeLinear
MIXED_SCALE_OPSET = 23  # first opset whose QuantizeLinear takes a scale type unlike its input's
EXPORTER_MAX_OPSET = 20  # what torch.onnx's TorchScript exporter writes; newer via the converter
INPUT, OUTPUT = "input", "logits"
PRECISIONS = {
    "fp32": (torch.float32, TensorProto.FLOAT),
    "fp16": (torch.float16, TensorProto.FLOAT16),
}


def default_opset(precision: str) -> int:
    """The lowest opset that keeps the study's float32 scales exact at `precision`."""
    return FP8_QDQ_OPSET if precision == "fp32" else MIXED_SCALE_OPSET


@dataclass
class QdqGraph:
    """The exported pair: the float graph (fp16 TensorRT engine) and the Q/DQ graph (FP8 engine)."""

    float_model: onnx.ModelProto
    qdq_model: onnx.ModelProto
    precision: str
    opset: int
    scale_dtype: str  # "float32" or "float16"
    max_scale_rounding: float  # largest relative change of a scale stored in scale_dtype
    layers: list[str] = field(default_factory=list)  # FP8 layers, in the record's order
    tensors: list[str] = field(default_factory=list)  # Q/DQ'd input tensors (one per scale)


def export_float(
    model: nn.Module, example: torch.Tensor, precision: str, opset: int
) -> onnx.ModelProto:
    """`model` as an ONNX graph at `precision`, batch dimension dynamic, Identity copies of
    shared initializers inlined (so each layer's weight keeps its parameter name)."""
    dtype, _ = PRECISIONS[precision]
    m = drop_eval_caches(model.to(dtype).eval())
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            m,
            (example.to(dtype),),
            buf,
            dynamo=False,
            opset_version=min(opset, EXPORTER_MAX_OPSET),
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            do_constant_folding=True,
        )
    proto = onnx.load_from_string(buf.getvalue())
    _inline_identities(proto.graph)
    if opset > EXPORTER_MAX_OPSET:
        proto = onnx.version_converter.convert_version(proto, opset)
    return proto


def build_qdq(rebuilt: Rebuilt, precision: str = "fp16", opset: int | None = None) -> QdqGraph:
    """The float and Q/DQ graphs of the rebuilt study (`rebuild.rebuild`)."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {sorted(PRECISIONS)}, not {precision}")
    opset = opset or default_opset(precision)
    if opset < FP8_QDQ_OPSET:
        raise UserError(
            f"--opset {opset}: FP8 QuantizeLinear/DequantizeLinear need opset {FP8_QDQ_OPSET} "
            "or newer"
        )
    if opset > onnx.defs.onnx_opset_version():
        raise UserError(
            f"--opset {opset}: this onnx knows opsets up to {onnx.defs.onnx_opset_version()}"
        )
    example = rebuilt.example
    float_model = export_float(copy.deepcopy(rebuilt.deployed), example, precision, opset)
    qdq = onnx.ModelProto()
    qdq.CopyFrom(float_model)
    scale_fp32 = precision == "fp32" or opset >= MIXED_SCALE_OPSET
    graph = _Inserter(qdq.graph, PRECISIONS[precision][1], scale_fp32)
    plan = rebuilt.plan
    for name in plan.layers:
        weight = rebuilt.deployed.get_submodule(name).weight.detach().float()
        graph.quantize_weight(name, weight, plan.per_channel)
    tensors = []
    for key, consumers in plan.calibration.groups.items():
        scale = plan.calibration.amax[key] / E4M3_MAX  # as the study computed it
        graph.quantize_input(key, consumers, np.float32(scale))
        tensors.append(key)
    graph.finish()
    for proto in (float_model, qdq):
        _stamp(proto, rebuilt, precision)
    return QdqGraph(
        float_model,
        qdq,
        precision,
        opset,
        "float32" if scale_fp32 else "float16",
        graph.max_rounding,
        list(plan.layers),
        tensors,
    )


def _inline_identities(graph: onnx.GraphProto) -> None:
    """The exporter writes one initializer for equal parameters and Identity nodes for the
    others; give each its own initializer again (needed to find a layer's weight by name)."""
    inits = {i.name: i for i in graph.initializer}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            twin = onnx.TensorProto()
            twin.CopyFrom(inits[node.input[0]])
            twin.name = node.output[0]
            graph.initializer.append(twin)
            inits[twin.name] = twin
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)


def _fp8(name: str, values: torch.Tensor) -> onnx.TensorProto:
    """A FLOAT8E4M3FN initializer holding exactly the bits of `values` (torch.float8_e4m3fn)."""
    raw = values.contiguous().view(torch.uint8).numpy().tobytes()
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(values.shape), raw, raw=True)


def _stamp(proto: onnx.ModelProto, rebuilt: Rebuilt, precision: str) -> None:
    """Which study the graph is, in the model's metadata (read by `import-trt` and people)."""
    r = rebuilt.record
    recipe, _ = recipe_and_calibration(r)
    meta = {
        "quantstudy.study": r.name,
        "quantstudy.model": r.model.name,
        "quantstudy.recipe": recipe.name,
        "quantstudy.recipe_sha256": recipe.sha256,
        "quantstudy.precision": precision,
        "quantstudy.fp8_layers": str(len(rebuilt.plan.layers)),
    }
    del proto.metadata_props[:]
    for k, v in meta.items():
        proto.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    proto.producer_name = "quantstudy"
    proto.ir_version = min_ir_version(proto)


def min_ir_version(proto: onnx.ModelProto) -> int:
    """The lowest IR version that `proto`'s opsets need. The `onnx` package stamps its own
    newest IR version (14 in onnx 1.23), which an older runtime refuses ("Unsupported model IR
    version: 14, max supported IR version: 13" in onnxruntime 1.30) though nothing in the graph
    needs it; the lowest one is read by every runtime that knows the opset."""
    return int(helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True))


class _Inserter:
    """Adds weight DQ and input Q/DQ nodes to a graph, then puts every node in order."""

    def __init__(self, graph: onnx.GraphProto, float_type: int, scale_fp32: bool) -> None:
        self.graph = graph
        self.float_type = float_type
        self.scale_type = TensorProto.FLOAT if scale_fp32 else float_type
        self.scale_np = np.float32 if scale_fp32 else np.float16
        self.inits = {i.name: i for i in graph.initializer}
        self.weight_nodes: list[onnx.NodeProto] = []
        self.input_nodes: dict[str, list[onnx.NodeProto]] = {}  # tensor -> [Q, DQ]
        self.max_rounding = 0.0

    def _scale(self, name: str, value: np.ndarray) -> str:
        stored: np.ndarray = value.astype(self.scale_np)
        if value.size:
            rel = np.abs(stored.astype(np.float64) - value.astype(np.float64)) / np.abs(value)
            self.max_rounding = max(self.max_rounding, float(rel.max()))
        self.graph.initializer.append(numpy_helper.from_array(stored, name))
        return name

    def _dq_attrs(self) -> dict[str, int]:
        """DequantizeLinear writes its scale's type; a float32 scale in an fp16 graph asks for
        fp16 output (opset 23's `output_dtype`)."""
        return {"output_dtype": self.float_type} if self.scale_type != self.float_type else {}

    def _consumer(self, layer: str) -> onnx.NodeProto:
        found = [
            n
            for n in self.graph.node
            if n.op_type in ("Conv", "Gemm") and n.input[1] == f"{layer}.weight"
        ]
        if len(found) != 1:
            raise UserError(
                f"FP8 layer {layer}: its weight {layer}.weight feeds {len(found)} Conv/Gemm nodes "
                "in the exported graph, not one; export supports conv2d and 2-D linear layers"
            )
        node = found[0]
        if node.op_type == "Gemm" and not any(
            a.name == "transB" and a.i == 1 for a in node.attribute
        ):
            raise UserError(f"FP8 layer {layer}: exported as a Gemm without transB; not supported")
        return node

    def quantize_weight(self, layer: str, weight: torch.Tensor, per_channel: bool) -> None:
        """Store the layer's weight in FP8; its DequantizeLinear writes the tensor the layer's
        node already reads (`<layer>.weight`), so the node itself is unchanged."""
        self._consumer(layer)
        w8, scale = quantize_weight(weight, per_channel)
        name = f"{layer}.weight"
        init = self.inits.pop(name, None)
        if init is None:
            raise UserError(f"FP8 layer {layer}: weight {name} is not an initializer of the graph")
        self.graph.initializer.remove(init)
        self.graph.initializer.append(_fp8(f"{layer}.weight_fp8", w8))
        zero = torch.zeros(scale.shape, dtype=w8.dtype)
        self.graph.initializer.append(_fp8(f"{layer}.weight_zero_point", zero))
        s = self._scale(f"{layer}.weight_scale", scale.numpy().astype(np.float32))
        attrs = {"axis": 0} if per_channel else {}
        self.weight_nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{layer}.weight_fp8", s, f"{layer}.weight_zero_point"],
                [name],
                name=f"{layer}/weight_dequantize",
                **attrs,
                **self._dq_attrs(),
            )
        )

    def quantize_input(self, key: str, consumers: list[str], scale: np.float32) -> None:
        nodes = [self._consumer(c) for c in consumers]
        sources = {n.input[0] for n in nodes}
        if len(sources) != 1:
            raise UserError(
                f"layers {consumers} share one calibrated scale in the study but read "
                f"{len(sources)} different tensors in the exported graph"
            )
        tensor = sources.pop()
        s = self._scale(f"{key}.input_scale", np.asarray(scale, dtype=np.float32))
        zero = f"{key}.input_zero_point"
        self.graph.initializer.append(_fp8(zero, torch.zeros((), dtype=torch.float8_e4m3fn)))
        q_out, dq_out = f"{key}:input_fp8", f"{key}:input_dq"
        self.input_nodes[tensor] = [
            helper.make_node(
                "QuantizeLinear",
                [tensor, s, zero],
                [q_out],
                name=f"{key}/input_quantize",
                saturate=1,
            ),
            helper.make_node(
                "DequantizeLinear",
                [q_out, s, zero],
                [dq_out],
                name=f"{key}/input_dequantize",
                **self._dq_attrs(),
            ),
        ]
        for n in nodes:
            n.input[0] = dq_out

    def finish(self) -> None:
        """Weight DQs first; each input Q/DQ right after the node that writes its tensor."""
        ordered = list(self.weight_nodes)
        graph_inputs = {i.name for i in self.graph.input}
        for tensor, pair in self.input_nodes.items():
            if tensor in graph_inputs:
                ordered += pair
        for node in self.graph.node:
            ordered.append(node)
            for out in node.output:
                ordered += self.input_nodes.get(out, [])
        del self.graph.node[:]
        self.graph.node.extend(ordered)
