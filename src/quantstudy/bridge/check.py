"""`quantstudy export --check`: the exported ONNX proven without TensorRT.

Structure: `onnx.checker` (full check); one QuantizeLinear/DequantizeLinear pair per calibrated
input tensor of the study and nothing else quantized; each pair's scale equal to the study's
(to the precision the graph stores); every FP8 layer's weight a FLOAT8E4M3FN initializer behind a
DequantizeLinear.

Numerics: the ONNX run on onnxruntime (CPU) on the study's held-out images against the study's
fake-quant engine rebuilt from the record, compared as the study compares its FP8 engine with
that emulation: top-1 agreement, differing images, KL(fake-quant || ONNX), max |logit
difference|, with the study's reassociation floor beside them. onnxruntime runs with basic graph
optimizations only: its extended QDQ fusions drop a ReLU that feeds an FP8 QuantizeLinear (valid
for uint8 with zero point 0, wrong for signed FP8), and the answer changes without an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, numpy_helper

from quantstudy.bridge.qdq import INPUT, QdqGraph
from quantstudy.bridge.rebuild import recipe_and_calibration
from quantstudy.quality.gap import emulation_gap
from quantstudy.quality.metrics import max_abs_logit_diff
from quantstudy.record import StudyRecord

NUMPY_INPUT = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


# onnxruntime's WeightBiasQuantization (a basic-level pass) rewrites the bias of a Conv between
# DequantizeLinear nodes into int32 at scale x_scale * w_scale: a rounding of the bias that
# neither the study nor TensorRT makes (and with an fp16 graph and fp32 scales it builds a graph
# onnxruntime itself then refuses).
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]


def session(model: onnx.ModelProto | str, threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime CPU session that runs the graph as written: basic optimizations only,
    without the pass that quantizes biases."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.intra_op_num_threads = threads
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(
        source, options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS
    )


def run_onnx(model: onnx.ModelProto, images: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """float32 logits of `model` for `images`, in order."""
    sess = session(model)
    elem = model.graph.input[0].type.tensor_type.elem_type
    dtype = NUMPY_INPUT[elem]
    outs = [
        sess.run(None, {INPUT: images[i : i + batch].numpy().astype(dtype)})[0]
        for i in range(0, images.shape[0], batch)
    ]
    return torch.from_numpy(np.concatenate(outs).astype(np.float32))


@dataclass
class Finding:
    name: str
    passed: bool
    detail: str


@dataclass
class CheckResult:
    """Every check with its outcome; truthy when all passed."""

    findings: list[Finding] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str) -> None:
        self.findings.append(Finding(name, passed, detail))

    def __bool__(self) -> bool:
        return all(f.passed for f in self.findings)

    def lines(self) -> list[str]:
        return [f"  [{'pass' if f.passed else 'FAIL'}] {f.name}: {f.detail}" for f in self.findings]


def check_structure(model: onnx.ModelProto, record: StudyRecord, result: CheckResult) -> None:
    """Checker, Q/DQ count and placement, scales, FP8 weights."""
    try:
        onnx.checker.check_model(model, full_check=True)
        result.add("onnx.checker", True, "full check passed")
    except onnx.checker.ValidationError as e:
        result.add("onnx.checker", False, str(e).splitlines()[0])
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    by_output = {o: n for n in g.node for o in n.output}
    quants = [n for n in g.node if n.op_type == "QuantizeLinear"]
    deq = [n for n in g.node if n.op_type == "DequantizeLinear"]
    recipe, calibration = recipe_and_calibration(record)
    tensors = calibration.tensors
    layers = [d.name for d in recipe.selected]
    pairs = [
        n
        for n in deq
        if n.input[0] in by_output and by_output[n.input[0]].op_type == "QuantizeLinear"
    ]
    result.add(
        "Q/DQ pairs",
        len(quants) == len(pairs) == len(tensors),
        f"{len(quants)} QuantizeLinear, {len(pairs)} Q/DQ pairs, {len(tensors)} calibrated "
        f"input tensors for {len(layers)} FP8 layers",
    )
    wrong_scales = []
    for t in tensors:
        key = t.tensor.removesuffix(":input")
        init = inits.get(f"{key}.input_scale")
        if init is None:
            wrong_scales.append(f"{key}: no scale")
            continue
        stored = numpy_helper.to_array(init)
        expected = np.asarray(np.float32(t.scale)).astype(stored.dtype)
        if stored.shape != () or stored != expected:
            wrong_scales.append(f"{key}: {float(stored.ravel()[0]):.6g} (study {t.scale:.6g})")
    result.add(
        "input scales = study's",
        not wrong_scales,
        "every Q/DQ scale is the calibrated one"
        if not wrong_scales
        else f"{len(wrong_scales)} differ: " + "; ".join(wrong_scales[:3]),
    )
    not_fp8 = []
    for name in layers:
        node = by_output.get(f"{name}.weight")
        src = (
            inits.get(node.input[0])
            if node is not None and node.op_type == "DequantizeLinear"
            else None
        )
        if src is None or src.data_type != TensorProto.FLOAT8E4M3FN:
            not_fp8.append(name)
    result.add(
        "FP8 weights",
        not not_fp8,
        f"all {len(layers)} FP8 layers' weights are float8e4m3fn initializers behind a "
        "DequantizeLinear"
        if not not_fp8
        else f"{len(not_fp8)} are not: {not_fp8[:3]}",
    )


@dataclass(frozen=True)
class Agreement:
    """The ONNX against the fake-quant engine on the held-out images."""

    n_images: int
    agreement: float
    differ_count: int
    kl_mean: float
    kl_max: float
    max_abs_logit_diff: float


def compare(onnx_logits: torch.Tensor, fakequant_logits: torch.Tensor) -> Agreement:
    gap = emulation_gap(onnx_logits, fakequant_logits)
    return Agreement(
        onnx_logits.shape[0],
        gap.agreement,
        gap.differ_count,
        gap.kl_mean,
        gap.kl_max,
        max_abs_logit_diff(onnx_logits, fakequant_logits),
    )


# "At the floor": the ONNX may differ from the fake-quant engine as much as the fake-quant engine
# differs from itself with only its fp32 summation order changed, measured on the same images
# (`Floor`), within counting noise: differing images at most the floor's plus three Poisson
# standard deviations, and mean KL at most FLOOR_KL_FACTOR times the floor's. A wrong scale or
# a misplaced quantizer moves KL by orders of magnitude.
FLOOR_SIGMAS = 3.0
FLOOR_KL_FACTOR = 3.0


@dataclass(frozen=True)
class Floor:
    """The fake-quant engine against itself channels-last, on the check's images."""

    differ_count: int
    agreement: float
    kl_mean: float

    def differ_limit(self) -> int:
        return int(self.differ_count + FLOOR_SIGMAS * max(self.differ_count, 1) ** 0.5)


def floor_of(reordered: torch.Tensor, fakequant: torch.Tensor) -> Floor:
    gap = emulation_gap(reordered, fakequant)
    return Floor(gap.differ_count, gap.agreement, gap.kl_mean)


def check_numerics(
    agreement: Agreement,
    floor: Floor,
    record: StudyRecord,
    result: CheckResult,
    label: str,
    gated: bool,
) -> None:
    """Agreement with the fake-quant engine at the reassociation floor (see FLOOR_SIGMAS)."""
    text = (
        f"agreement {agreement.agreement:.4f} ({agreement.differ_count} of {agreement.n_images} "
        f"differ), KL mean {agreement.kl_mean:.3g}, KL max {agreement.kl_max:.3g}, max |logit "
        f"diff| {agreement.max_abs_logit_diff:.3g}; floor here: agreement {floor.agreement:.4f} "
        f"({floor.differ_count} differ), KL mean {floor.kl_mean:.3g}"
    )
    gap = record.quality.emulation_gap if record.quality else None
    if gap is not None and gap.floor_agreement is not None:
        text += (
            f"; study's floor ({record.environment.gpu_name or record.environment.cpu}): "
            f"agreement {gap.floor_agreement:.4f} ({gap.floor_differ_count} differ), "
            f"KL mean {gap.floor_kl_mean:.3g}"
        )
    if not gated:
        result.add(label, True, text + " (reported, not gated)")
        return
    kl_limit = FLOOR_KL_FACTOR * max(floor.kl_mean, 1e-12)
    passed = agreement.differ_count <= floor.differ_limit() and agreement.kl_mean <= kl_limit
    result.add(
        label,
        passed,
        text + f" (at the floor: at most {floor.differ_limit()} differ and KL mean <= "
        f"{kl_limit:.3g})",
    )


def summary(graph: QdqGraph) -> str:
    return (
        f"{len(graph.layers)} FP8 layers, {len(graph.tensors)} Q/DQ pairs, {graph.precision} "
        f"graph, opset {graph.opset}, scales {graph.scale_dtype}"
        + (
            f" (largest scale rounding {graph.max_scale_rounding:.2e})"
            if graph.max_scale_rounding
            else ""
        )
    )
