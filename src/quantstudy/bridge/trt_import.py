"""`quantstudy import-trt STUDY_DIR --fp16 DIR --fp8 DIR`: trtexec's timings as a study.

The result is a copy of the study in `<study>/tensorrt/` (or `--out`) whose speed section is
TensorRT's (`SpeedSection.engine = "tensorrt"`), decided again under the policy and rendered;
the study itself is left as it was. Per batch size: GPU compute time per inference (trtexec's
`computeMs`, CUDA graph, no data transfers) of the fp16 and FP8 engines, median and quartiles;
x = fp16 / FP8 from their quantiles, since the two engines ran in separate trtexec processes and
have no paired rounds (median of x = ratio of medians; its q1 = fp16 q1 / FP8 q3 and its
q3 = fp16 q3 / FP8 q1, the wide side). Layer time per group from the per-layer profile; which
recipe layers TensorRT really ran in FP8 from the engine's layer information.

Quality stays the study's: TensorRT's FP8 engine was not run on the held-out images, and the
record says so. `export --check` shows the ONNX computes what the study's emulation computes.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from quantstudy.bridge.qdq import INPUT
from quantstudy.bridge.trt_json import (
    EngineLayer,
    LayerInfo,
    ProfiledLayer,
    read_layer_info,
    read_log,
    read_profile,
    read_times,
)
from quantstudy.bridge.trtexec import ENGINES, result_file
from quantstudy.decision.policy import decide, load_policy
from quantstudy.engines.interleaved import timing_stats
from quantstudy.record import (
    SCHEMA_VERSION,
    BatchSpeed,
    KernelBreakdown,
    KernelGroupTime,
    SpeedSection,
    StudyRecord,
    TimingStats,
)
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_record
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.speed import LayerPrecision
from quantstudy.record.vocab import CompileMode, Engine, KernelGroup
from quantstudy.report.render import render_study

ENGINE = "tensorrt"
TIMED_REGION = (
    "TensorRT engine per inference, trtexec GPU compute time (computeMs): CUDA graph launch, "
    "no host-device copies; fp16 and FP8 engines timed in separate trtexec runs (--warmUp=500 "
    "ms, --duration=10 s), x from their quantiles"
)
NOT_RUN_TRT = (
    "The TensorRT FP8 engine's quality was not measured: the quality gates use the study's own "
    "FP8 engine (the exported ONNX matches its fake-quant emulation, `export --check`)."
)
# The study's own statements that TensorRT timings now answer.
STALE_NOT_RUN = ("No TensorRT engine", "Speed was not measured", "GPU timings were not measured")
CONV_TYPES = ("convolution", "gemm", "matrixmultiply", "fullyconnected")


def import_trt(
    study_dir: Path,
    fp16_dir: Path,
    fp8_dir: Path,
    onnx_file: Path | None = None,
    out: Path | None = None,
    policy: str | None = None,
) -> tuple[StudyRecord, Path]:
    """Read trtexec's exports, write the TensorRT study; return it and its report path."""
    study_dir = Path(study_dir)
    record = load_record(study_dir / RECORD_FILE)
    out_dir = Path(out) if out is not None else study_dir / "tensorrt"
    onnx_file = Path(onnx_file) if onnx_file is not None else out_dir / "model.onnx"
    names = _layer_nodes(onnx_file, record)
    dirs: dict[str, Path] = {Engine.FP16: Path(fp16_dir), Engine.FP8: Path(fp8_dir)}
    batches = _batches(dirs)
    speed = _speed_section(record, dirs, batches, names)
    not_run = [n for n in record.not_run if not n.startswith(STALE_NOT_RUN)] + [NOT_RUN_TRT]
    update = {
        "schema_version": SCHEMA_VERSION,
        "name": f"{record.name}-tensorrt",
        "speed": speed,
        "not_run": not_run,
        "decision": None,
    }
    if "timings" in StudyRecord.model_fields:
        update["timings"] = None  # the wall time of the PyTorch study's run, not of this record
    new = record.model_copy(update=update)
    loaded_policy, label = load_policy(policy if policy is not None else _policy_of(record))
    new = new.model_copy(update={"decision": decide(new, loaded_policy, label)})
    write_record(out_dir / RECORD_FILE, new)
    return new, render_study(out_dir)


def _policy_of(record: StudyRecord) -> str | None:
    """The policy the study was decided under: its preset name or file (None: the default). A
    file a decision names by a relative path (recorded before labels were absolute) is relative
    to a folder the record does not say, so it is refused rather than read from this one."""
    label = record.decision.policy if record.decision is not None else None
    if label is None or label.startswith("builtin:"):
        return label.removeprefix("builtin:") if label is not None else None
    if not Path(label).is_absolute():
        raise UserError(
            f"the study was decided under the policy file {label}, a path relative to the "
            "folder that decision was taken in, which the record does not say; give it with "
            "--policy"
        )
    return label


def _layer_nodes(onnx_file: Path, record: StudyRecord) -> dict[str, str]:
    """FP8 layer -> name of its Conv/Gemm node in the exported graph (what TensorRT names)."""
    if not onnx_file.is_file():
        raise UserError(
            f"{onnx_file} is missing: give the Q/DQ ONNX the engines were built from with --onnx "
            "(`quantstudy export` writes it)"
        )
    model = onnx.load(onnx_file, load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    sha = record.recipe.sha256 if record.recipe else None
    if (
        meta.get("quantstudy.recipe_sha256") != sha
        or meta.get("quantstudy.model") != record.model.name
    ):
        raise UserError(
            f"{onnx_file} was exported from {meta.get('quantstudy.model', 'another model')} / "
            f"recipe {meta.get('quantstudy.recipe', '?')}, not this study's "
            f"{record.model.name} / {record.recipe.name if record.recipe else '?'}"
        )
    if record.recipe is None:  # and the graph names no recipe either
        raise UserError(
            f"study {record.name} has no recipe section (status {record.status}): import-trt "
            "needs the study that `quantstudy export` wrote the ONNX from"
        )
    by_weight = {n.input[1]: n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")}
    return {d.name: by_weight.get(f"{d.name}.weight", "") for d in record.recipe.selected}


def _batches(dirs: dict[str, Path]) -> list[int]:
    found = {}
    for engine, folder in dirs.items():
        if not folder.is_dir():
            raise UserError(f"--{engine} {folder} is not a folder of trtexec exports")
        found[engine] = sorted(
            int(p.name.split(".")[0][1:])
            for p in folder.glob("b*.times.json")
            if p.name.split(".")[0][1:].isdigit()
        )
        if not found[engine]:
            raise UserError(f"--{engine} {folder} holds no b<batch>.times.json (see trtexec.sh)")
    if found[Engine.FP16] != found[Engine.FP8]:
        raise UserError(
            f"the fp16 exports cover batches {found[Engine.FP16]}, "
            f"the FP8 exports {found[Engine.FP8]}; time both engines at the same batch sizes"
        )
    return found[Engine.FP16]


def _speed_section(
    record: StudyRecord, dirs: dict[str, Path], batches: list[int], names: dict[str, str]
) -> SpeedSection:
    rows, kernels = [], []
    precision: list[LayerPrecision] = []
    logs: dict[str, str] = {}
    for b in batches:
        times: dict[str, TimingStats] = {}
        infos: dict[str, LayerInfo] = {}
        for engine in ENGINES:
            folder = dirs[engine]
            times[engine] = timing_stats(read_times(result_file(folder, b, "times")))
            infos[engine] = read_layer_info(result_file(folder, b, "layers"))
            if infos[engine].batch != b:
                raise UserError(
                    f"{result_file(folder, b, 'layers')}: the engine reads '{INPUT}' at batch "
                    f"{infos[engine].batch}, not {b}; these files are from another trtexec run"
                )
            profile = read_profile(result_file(folder, b, "profile"))
            kernels.append(_breakdown(engine, b, profile, infos[engine]))
            logs |= {k: v for k, v in read_log(folder / f"b{b}.log").items() if k not in logs}
        layer_precision = _precision(infos[Engine.FP8], names)
        _check_engines(infos, layer_precision, dirs, b)
        if not precision:
            precision = layer_precision
        rows.append(_batch_speed(b, times[Engine.FP16], times[Engine.FP8], layer_precision))
    return SpeedSection(
        device=logs.get("device", "GPU not named (no trtexec log beside the JSON)"),
        meaningful=True,
        compile_mode=CompileMode.DEFAULT,  # not an Inductor build; `engine` says what ran
        timed_region=TIMED_REGION,
        rounds=min(r.fp16_ms.n for r in rows),
        iters_per_round=1,
        warmup=0,
        input_buffers=1,
        clocks={},
        batches=rows,
        kernels=kernels,
        weight_bytes={},
        engine=ENGINE,
        engine_version=logs.get("tensorrt"),
        layer_precision=precision,
    )


def _precision(info: LayerInfo, names: dict[str, str]) -> list[LayerPrecision]:
    """Each FP8 layer of the recipe: the engine layer whose (fused) name holds its node."""
    out = []
    for layer, node in names.items():
        holder = next((e for e in info.layers if node and node in e.name.split(" + ")), None)
        if holder is None and node:
            holder = next((e for e in info.layers if node in e.name), None)
        if holder is None:
            out.append(LayerPrecision(layer=layer, precision="not found"))
        else:
            out.append(
                LayerPrecision(layer=layer, precision=holder.precision, engine_layer=holder.name)
            )
    return out


def _check_engines(
    infos: dict[str, LayerInfo], precision: list[LayerPrecision], dirs: dict[str, Path], b: int
) -> None:
    """The FP8 engine must be this study's: its layers name the recipe's nodes; the fp16 engine
    must hold no FP8 layer."""
    if precision and all(p.precision == "not found" for p in precision):
        raise UserError(
            f"{result_file(dirs[Engine.FP8], b, 'layers')}: none of the study's "
            f"{len(precision)} FP8 layers is in this engine; its timings are from another model "
            "or export"
        )
    fp8_in_fp16 = [e.name for e in infos[Engine.FP16].layers if e.precision == "fp8"]
    if fp8_in_fp16:
        raise UserError(
            f"{result_file(dirs[Engine.FP16], b, 'layers')}: holds FP8 layers ({fp8_in_fp16[0]}); "
            "--fp16 must be the float engine's exports"
        )


def _batch_speed(
    b: int, fp16: TimingStats, fp8: TimingStats, precision: list[LayerPrecision]
) -> BatchSpeed:
    ratio = TimingStats(
        median=fp16.median / fp8.median,
        q1=fp16.q1 / fp8.q3,
        q3=fp16.q3 / fp8.q1,
        min=fp16.min / fp8.max,
        max=fp16.max / fp8.min,
        n=min(fp16.n, fp8.n),
    )
    warnings = []
    not_fp8 = [p.layer for p in precision if p.precision != "fp8"]
    if not_fp8:
        warnings.append(
            f"TensorRT ran {len(not_fp8)} of the recipe's {len(precision)} FP8 layers in another "
            f"precision (first: {not_fp8[0]})"
        )
    return BatchSpeed(batch=b, fp16_ms=fp16, fp8_ms=fp8, ratio=ratio, warnings=warnings)


def _group(layer: EngineLayer | None, name: str) -> KernelGroup:
    kind = (layer.layer_type if layer else "").lower()
    lowered = name.lower()
    if layer is not None and any(t in kind for t in CONV_TYPES):
        if layer.groups is not None and layer.groups > 1:
            return KernelGroup.DEPTHWISE_CONV
        return KernelGroup.FP8_MATMUL if layer.precision == "fp8" else KernelGroup.FP16_MATMUL_CONV
    if "reformat" in kind or "quantize" in lowered or "quantize" in kind:
        return KernelGroup.QUANTIZE_CONVERT
    return KernelGroup.OTHER


def _breakdown(
    engine: str, b: int, profile: list[ProfiledLayer], info: LayerInfo
) -> KernelBreakdown:
    """Layer time per group: the profile's average ms per inference, grouped by layer info."""
    by_name = {e.name: e for e in info.layers}
    sums: dict[KernelGroup, list[float]] = {}
    for p in profile:
        group = _group(by_name.get(p.name), p.name)
        sums.setdefault(group, []).append(p.average_ms * 1000.0)
    groups = [
        KernelGroupTime(group=g, time_us=sum(sums[g]), count=len(sums[g]))
        for g in KernelGroup
        if g in sums
    ]
    top = sorted(((p.name, p.average_ms * 1000.0) for p in profile), key=lambda t: -t[1])[:5]
    return KernelBreakdown(
        engine=engine,
        batch=b,
        kernel_count=len(profile),  # engine layers, each one or more kernels
        total_us=sum(g.time_us for g in groups),
        groups=groups,
        top_kernels=top,
    )
