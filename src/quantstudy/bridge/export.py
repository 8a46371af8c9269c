"""`quantstudy export STUDY_DIR`: the study's recipe as ONNX, the trtexec script, the check."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

from quantstudy.bridge.check import (
    CheckResult,
    Floor,
    check_numerics,
    check_structure,
    compare,
    floor_of,
    run_onnx,
)
from quantstudy.bridge.qdq import QdqGraph, build_qdq
from quantstudy.bridge.rebuild import Rebuilt, eval_batch, load_set, rebuild
from quantstudy.bridge.trtexec import SCRIPT, script
from quantstudy.engines.base import in_memory_format
from quantstudy.engines.builders import build_fakequant
from quantstudy.engines.run import run_engine
from quantstudy.record import StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_bytes_atomic, write_text_atomic
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import Engine

DEFAULT_NAME = "model.onnx"


@dataclass
class Exported:
    qdq_path: Path
    float_path: Path
    script_path: Path
    graph: QdqGraph
    rebuilt: Rebuilt
    study_dir: Path


def float_path_of(qdq_path: Path) -> Path:
    return qdq_path.with_name(qdq_path.stem + ".float.onnx")


def export_study(
    study_dir: Path,
    out: Path | None = None,
    precision: str = "fp16",
    opset: int | None = None,
    data: Path | None = None,
    calib_data: Path | None = None,
    weights: Path | None = None,
) -> Exported:
    """Write `<out>` (Q/DQ graph), `<out stem>.float.onnx` and `trtexec.sh` beside them.
    `weights`: the study's checkpoint where it has moved (its sha256 must be the recorded one)."""
    study_dir = Path(study_dir)
    record = load_record(study_dir / RECORD_FILE)
    qdq_path = Path(out) if out is not None else study_dir / "tensorrt" / DEFAULT_NAME
    if qdq_path.suffix != ".onnx":
        raise UserError(f"--out {qdq_path}: give a file name ending in .onnx")
    refuse_stepped_aside(record)
    rebuilt = rebuild(record, data, calib_data, weights)
    graph = build_qdq(rebuilt, precision, opset)
    float_path = float_path_of(qdq_path)
    write_bytes_atomic(qdq_path, graph.qdq_model.SerializeToString())
    write_bytes_atomic(float_path, graph.float_model.SerializeToString())
    script_path = qdq_path.parent / SCRIPT
    text = script(
        float_path.name,
        qdq_path.name,
        list(record.config.batches),
        tuple(record.preprocessing.input_size),
        precision,
        os.path.relpath(study_dir.resolve(), qdq_path.parent.resolve()),
    )
    write_text_atomic(script_path, text)
    script_path.chmod(0o755)
    return Exported(qdq_path, float_path, script_path, graph, rebuilt, study_dir)


def refuse_stepped_aside(record: StudyRecord) -> None:
    """Refuse a study whose FP8 engine kept selected layers in fp16 (`engines/step_aside.py`):
    the export writes Q/DQ on every selected layer, so its graph would not be the engine the
    study measured."""
    fp8 = record.engine(Engine.FP8)
    if fp8 is not None and fp8.layout.stepped_aside:
        n = len(fp8.layout.stepped_aside)
        raise UserError(
            f"study {record.name} kept {n} selected layers in fp16 (--fp8-kernel fastest, first: "
            f"{fp8.layout.stepped_aside[0]}), which the export would quantize; export a study run "
            "with --fp8-kernel fused, or with a recipe that excludes those layers"
        )


# The floor measured here against the one the study recorded: equal (to the reductions' noise)
# when the study ran where the check runs, on the same images, so the rebuilt emulation is the
# study's own.
REBUILD_KL_RTOL = 0.05


def _check_rebuild(
    record: StudyRecord, floor: Floor, all_images: bool, result: CheckResult, notes: list[str]
) -> None:
    gap = record.quality.emulation_gap if record.quality else None
    if gap is None or gap.floor_kl_mean is None:
        notes.append("the study recorded no floor: the rebuild is not compared with it")
    elif str(record.config.device) != "cpu" or not all_images:
        notes.append(
            f"the study ran on {record.config.device}"
            + ("" if all_images else " and the check used a subset")
            + ": its recorded floor is shown, not compared with the rebuild's"
        )
    else:
        same = floor.differ_count == gap.floor_differ_count and math.isclose(
            floor.kl_mean, gap.floor_kl_mean, rel_tol=REBUILD_KL_RTOL, abs_tol=1e-12
        )
        result.add(
            "rebuild = study",
            same,
            f"the rebuilt emulation's floor ({floor.differ_count} differ, KL mean "
            f"{floor.kl_mean:.4g}) {'matches' if same else 'differs from'} the study's "
            f"({gap.floor_differ_count} differ, KL mean {gap.floor_kl_mean:.4g})",
        )


def check_export(
    exported: Exported, data: Path | None = None, images: int | None = None
) -> tuple[CheckResult, list[str]]:
    """Structure and numerics of the written Q/DQ graph; returns the result and notes."""
    rebuilt = exported.rebuilt
    record = rebuilt.record
    result = CheckResult()
    model = onnx.load(exported.qdq_path)
    check_structure(model, record, result)
    x, _ = load_set(exported.study_dir, record, record.data.heldout, data)
    if images is not None:
        x = x[:images]
    batch = eval_batch(record)
    fakequant = build_fakequant(
        rebuilt.model, torch.device("cpu"), rebuilt.example, rebuilt.plan, fold=rebuilt.fold_bn
    )
    with torch.no_grad():
        reference = run_engine(fakequant, x, batch)
        # The study's floor procedure (`study/run.py`): the emulation again, channels-last.
        fakequant.channels_last = True
        fakequant.module = in_memory_format(fakequant.module, torch.channels_last)
        floor = floor_of(run_engine(fakequant, x, batch), reference)
    notes = [f"held-out images: {x.shape[0]} of the study's {record.data.heldout.n_images}"]
    _check_rebuild(record, floor, images is None, result, notes)
    written = compare(run_onnx(model, x, batch), reference)
    if exported.graph.precision == "fp32":
        check_numerics(written, floor, record, result, "ONNX vs fake-quant", gated=True)
    else:
        # The fake-quant engine computes in fp32: the floor bounds an fp32 graph. The same
        # graph at fp32 (same Q/DQ points, scales and FP8 weights) is held to it; the written
        # fp16 graph's own figures are reported beside it.
        twin = build_qdq(rebuilt, "fp32", None)
        check_numerics(
            compare(run_onnx(twin.qdq_model, x, batch), reference),
            floor,
            record,
            result,
            "ONNX at fp32 vs fake-quant",
            gated=True,
        )
        check_numerics(
            written,
            floor,
            record,
            result,
            f"ONNX as written ({exported.graph.precision})",
            gated=False,
        )
        notes.append(
            "the fp32 twin differs from the written graph only in its float type (same Q/DQ "
            "nodes, scales and FP8 weights)"
        )
    return result, notes
