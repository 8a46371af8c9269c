"""The `export` and `import-trt` subcommands: their arguments and what they print."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from quantstudy.cli_base.command import Command
from quantstudy.record.errors import EXIT_COMMON, UserError


def _export_arguments(export: argparse.ArgumentParser) -> None:
    export.add_argument("study_dir", type=Path)
    export.add_argument(
        "--out", type=Path, help="Q/DQ ONNX file (default STUDY_DIR/tensorrt/model.onnx)"
    )
    export.add_argument(
        "--precision",
        choices=["fp16", "fp32"],
        default="fp16",
        help="float type of the graph (default fp16, what the FP8 engine runs outside FP8 layers)",
    )
    export.add_argument(
        "--opset",
        type=int,
        help="ONNX opset (default: 19 for fp32; 23 for fp16, the first that keeps fp32 scales)",
    )
    export.add_argument(
        "--check",
        action="store_true",
        help="check the ONNX: structure, and onnxruntime against the study's fake-quant engine",
    )
    export.add_argument("--data", type=Path, help="folder of the study's held-out images")
    export.add_argument(
        "--calib-data", type=Path, help="random-weight studies: folder of the calibration images"
    )
    export.add_argument("--images", type=int, help="--check on the first N held-out images only")
    export.add_argument(
        "--weights",
        type=Path,
        help="the study's checkpoint file where it has moved since the study (checked against "
        "the sha256 the study recorded)",
    )


def _import_arguments(imp: argparse.ArgumentParser) -> None:
    imp.add_argument("study_dir", type=Path)
    imp.add_argument("--fp16", type=Path, required=True, help="folder of the fp16 engine's exports")
    imp.add_argument("--fp8", type=Path, required=True, help="folder of the FP8 engine's exports")
    imp.add_argument("--onnx", type=Path, help="the Q/DQ ONNX (default: OUT/model.onnx)")
    imp.add_argument(
        "--out", type=Path, help="folder of the TensorRT study (default STUDY_DIR/tensorrt)"
    )
    imp.add_argument("--policy", help="decision policy (default: the study's)")


# What `export` imports beyond the core install: module -> the package pip installs it from.
EXPORT_NEEDS = {"onnx": "onnx"}
CHECK_NEEDS = {"onnxruntime": "onnxruntime"}


def require_modules(needs: dict[str, str], what: str) -> None:
    """Refuse in one line, naming the install command, when an optional dependency of `what`
    is missing (the `onnx` extra of pyproject.toml holds them)."""
    missing = [pip for module, pip in needs.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise UserError(
            f"{what} needs {' and '.join(missing)}, which is not installed: "
            f"pip install 'quantstudy[onnx]' (or pip install {' '.join(missing)})"
        )


def _check_opset(opset: int) -> None:
    import onnx

    from quantstudy.bridge.qdq import FP8_QDQ_OPSET

    newest = onnx.defs.onnx_opset_version()
    if not FP8_QDQ_OPSET <= opset <= newest:
        raise UserError(
            f"--opset {opset}: FP8 QuantizeLinear/DequantizeLinear need opset {FP8_QDQ_OPSET} "
            f"or newer, and this onnx knows opsets up to {newest}"
        )


def _exportable(study_dir: Path) -> None:
    """Export ships the study's numbers: only a complete, sealed record is exported."""
    from quantstudy.record.load import RECORD_FILE, load_record

    path = Path(study_dir) / RECORD_FILE
    record = load_record(path, "export")  # refuses a missing, unknown, invalid or unsealed one
    if record.status != "complete":
        raise UserError(
            f"{path} is a {record.status} study: export writes only what a complete study "
            "measured; rerun the study's command to finish it"
        )


def _export(args: argparse.Namespace) -> int:
    from quantstudy.study.guard import holding

    with holding(args.study_dir):
        return _run_export(args)


def _run_export(args: argparse.Namespace) -> int:
    if args.images is not None and args.images < 1:
        raise UserError("--images must be at least 1")
    require_modules(EXPORT_NEEDS | (CHECK_NEEDS if args.check else {}), "export")
    if args.opset is not None:  # before the model is rebuilt, not after
        _check_opset(args.opset)
    if args.weights is not None and not args.weights.is_file():
        raise UserError(f"--weights {args.weights} is not a file; pass the study's checkpoint")
    _exportable(args.study_dir)
    from quantstudy.bridge.check import summary
    from quantstudy.bridge.export import check_export, export_study

    if args.check:
        from quantstudy.bridge.qdq import default_opset
        from quantstudy.bridge.runtime import require_runtime

        require_runtime(args.precision, args.opset or default_opset(args.precision))
    exported = export_study(
        args.study_dir,
        args.out,
        args.precision,
        args.opset,
        args.data,
        args.calib_data,
        weights=args.weights,
    )
    print(f"{exported.qdq_path}: {summary(exported.graph)}")
    print(f"{exported.float_path}: the same graph without Q/DQ (fp16 engine)")
    print(f"{exported.script_path}: trtexec commands (needs TensorRT)")
    if not args.check:
        return 0
    result, notes = check_export(exported, args.data, args.images)
    print("check:")
    print("\n".join(result.lines()))
    for note in notes:
        print(f"  note: {note}")
    print("check passed" if result else "check FAILED")
    return 0 if result else 3


def _import(args: argparse.Namespace) -> int:
    from quantstudy.bridge.trt_import import import_trt
    from quantstudy.study.commands import print_outcome

    record, report = import_trt(
        args.study_dir, args.fp16, args.fp8, args.onnx, args.out, args.policy
    )
    speed = record.speed
    assert speed is not None  # import_trt writes the TensorRT engines' speed section
    print(f"TensorRT {speed.engine_version or '(version not logged)'} on {speed.device}")
    layers = speed.layer_precision or []
    fp8 = [p for p in layers if p.precision == "fp8"]
    print(f"FP8 in the engine: {len(fp8)} of the recipe's {len(layers)} FP8 layers")
    for p in layers:
        if p.precision != "fp8":
            print(f"  not FP8: {p.layer} ({p.precision})")
    return print_outcome(record, report)


EXPORT = Command(
    "write the study's FP8 recipe as a Q/DQ ONNX, its float twin and trtexec.sh",
    _export_arguments,
    _export,
    f"exit status: 0 written (and --check passed), 3 --check failed, {EXIT_COMMON}",
)
IMPORT_TRT = Command(
    "turn trtexec's JSON exports into a TensorRT copy of the study, decided and rendered",
    _import_arguments,
    _import,
)
