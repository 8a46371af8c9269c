"""The `trtexec` commands that build and time the exported pair, written as a script.

One engine per batch size (`--shapes` alone fixes the optimization profile to that shape), each
timed by trtexec and its three JSON exports kept for `quantstudy import-trt`:
`<dir>/b<B>.times.json` (per-inference times, `--exportTimes`), `b<B>.profile.json` (per-layer
times, `--exportProfile`) and `b<B>.layers.json` (engine layer information, `--exportLayerInfo`,
detailed), plus trtexec's own log `b<B>.log`. Flags per NVIDIA/TensorRT
`samples/common/sampleOptions.cpp`: TensorRT 10 needs `--useCudaGraph`, `--noDataTransfers` and
`--separateProfileRun` (per-layer profiling then runs apart from the timed run, which keeps its
CUDA graph); TensorRT 11 does all three by default and only warns about the flags.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from quantstudy.bridge.qdq import INPUT
from quantstudy.record.vocab import Engine

SCRIPT = "trtexec.sh"
ENGINES = (Engine.FP16, Engine.FP8)
FILES = ("times", "profile", "layers")  # b<B>.<kind>.json


def result_file(folder: Path, batch: int, kind: str) -> Path:
    return Path(folder) / f"b{batch}.{kind}.json"


def command(
    onnx_file: str, out_dir: str, batch: int, input_chw: tuple[int, ...], typed: str
) -> str:
    """One trtexec call: build at `batch`, time it, export times, profile and layer info."""
    shape = "x".join(str(d) for d in (batch, *input_chw))
    args = [
        "trtexec",
        f"--onnx={onnx_file}",
        typed,
        f"--shapes={INPUT}:{shape}",
        "--useCudaGraph",
        "--noDataTransfers",
        "--separateProfileRun",
        "--warmUp=500",
        "--duration=10",
        "--profilingVerbosity=detailed",
        f"--exportTimes={out_dir}/b{batch}.times.json",
        f"--exportProfile={out_dir}/b{batch}.profile.json",
        f"--exportLayerInfo={out_dir}/b{batch}.layers.json",
    ]
    return " ".join(shlex.quote(a) for a in args) + f" 2>&1 | tee {out_dir}/b{batch}.log"


def script(
    float_onnx: str,
    qdq_onnx: str,
    batches: list[int],
    input_chw: tuple[int, ...],
    precision: str,
    study_dir: str,
) -> str:
    """The bash script: fp16 engines from the float graph, FP8 engines from the Q/DQ graph."""
    # Strongly typed: every tensor keeps the type the ONNX gives it, so the FP8 engine runs FP8
    # exactly where the Q/DQ nodes are and fp16 elsewhere. An fp32 export has no fp16 tensors, so
    # its fp16 engine is built weakly typed with --fp16 and its FP8 engine keeps fp32 elsewhere.
    fp16_typed = "--stronglyTyped" if precision == "fp16" else "--fp16"
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `quantstudy export`: builds and times the study's fp16 and FP8 TensorRT",
        "# engines at each batch size, then hands trtexec's JSON back to the study.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "mkdir -p trt-fp16 trt-fp8",
    ]
    if precision != "fp16":
        lines.append(
            "# fp32 export: the FP8 engine's non-FP8 layers run fp32; export --precision fp16 "
            "for an FP8 engine comparable with the fp16 one."
        )
    for b in batches:
        lines.append(command(float_onnx, "trt-fp16", b, input_chw, fp16_typed))
        lines.append(command(qdq_onnx, "trt-fp8", b, input_chw, "--stronglyTyped"))
    lines.append(
        "quantstudy import-trt "
        + shlex.quote(study_dir)
        + ' --fp16 "$PWD/trt-fp16" --fp8 "$PWD/trt-fp8"'
    )
    return "\n".join(lines) + "\n"
