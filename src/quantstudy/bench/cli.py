"""The `quantstudy bench` subcommands: argparse only; the work is in the sibling modules.

`cli.py` hands in its own helpers (`add_config_args`: one option per `StudyConfig` field;
`study_config`: the config of the parsed options), so a bench takes the same study options,
with the same flags, help and checks, as `quantstudy run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from quantstudy.record.errors import UserError
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL, StudyConfig
from quantstudy.record.vocab import Fp8Kernel, choices

# The study options a speed or kernels bench takes (fields of `StudyConfig`).
BENCH_STUDY_OPTIONS = (
    "data",
    "calib_data",
    "class_list",
    "weights",
    "strip_prefix",
    "recipe",
    "calib",
    "heldout",
    "seed",
    "device",
    "batches",
    "compile_mode",
    "test_settings",
)
TIMED = (Fp8Kernel.FUSED, Fp8Kernel.SCALED_MM)
# Compute dtypes of `bench options --engine-dtypes`; the half ones are its storage dtypes
# (float32 storage is the emulation itself).
ENGINE_DTYPES = ("float32", "float16", "bfloat16")
# The study options of `bench options`: the model, data, split and recipe (nothing it times
# depends on the rest).
OPTIONS_STUDY_OPTIONS = tuple(
    o for o in BENCH_STUDY_OPTIONS if o not in ("batches", "compile_mode")
)


def _kernels(text: str) -> tuple[Fp8Kernel, ...]:
    names = text.split(",")
    unknown = [n for n in names if n not in choices(Fp8Kernel)]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"--kernels takes distinct names from {','.join(choices(Fp8Kernel))}, not '{text}'"
        )
    return tuple(Fp8Kernel(n) for n in names)


def _out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", dest="record", type=Path, required=True, help=f"{what} JSON to write")


# Benchmarks with parsers of their own: `quantstudy bench NAME ARGS...` hands ARGS to their main.
DELEGATED: dict[str, tuple[str, str]] = {
    "limit": (
        "quantstudy.bench.limit",
        "fp16 against the fused, per-layer-choice and scaled_mm FP8 engines beside the ideal x",
    ),
    "conv": ("quantstudy.bench.conv", "each dense kxk conv of a recipe: cuDNN fp16 against FP8"),
    "study-time": (
        "quantstudy.bench.study_time",
        "one study's stage times from cold caches and warm (each in its own process)",
    ),
    "scale": (
        "quantstudy.bench.scale",
        "one study at several held-out sizes: wall per stage and peak host memory",
    ),
}


def add_bench_parser(
    sub: argparse._SubParsersAction,
    add_config_args: Callable[[argparse.ArgumentParser, tuple[str, ...]], None],
) -> None:
    bench = sub.add_parser("bench", help="benchmarks: speed, FP8 products, depthwise, kernels")
    kinds = bench.add_subparsers(dest="bench_command", required=True)

    speed = kinds.add_parser(
        "speed", help="time the fp16 engine against each FP8 engine of a study (GPU; CPU: a check)"
    )
    speed.add_argument("model", help="timm name, optionally with tag")
    add_config_args(speed, BENCH_STUDY_OPTIONS)
    speed.add_argument(
        "--kernels",
        type=_kernels,
        default=TIMED,
        help="FP8 engines to time against fp16, comma-separated (default fused,scaled_mm)",
    )
    speed.add_argument("--rounds", type=int, default=30, help="timing rounds (default 30)")
    speed.add_argument("--iters", type=int, default=20, help="calls per round (default 20)")
    speed.add_argument(
        "--agreement",
        action="store_true",
        help="top-1 agreement of the fused and scaled_mm engines on every held-out image",
    )
    speed.add_argument(
        "--fp16-autotune-batch",
        type=int,
        help="also time fp16 under max-autotune against default mode at this batch (GPU)",
    )
    _out(speed, "record")

    for name, what in (
        ("gemm", "each FP8 product of a recipe alone, every way it runs (GPU)"),
        ("depthwise", "each depthwise conv alone: cuDNN fp16 against the Triton kernel (GPU)"),
    ):
        p = kinds.add_parser(name, help=what)
        p.add_argument("model", help="timm name (random weights: only shapes matter)")
        if name == "gemm":
            p.add_argument("--recipe", help="built-in recipe or YAML (default: family default)")
            p.add_argument("--sweep", action="store_true", help="also every tile on every path")
        p.add_argument("--batch", type=int, default=128, help="batch (default 128)")
        p.add_argument(
            "--shapes-only",
            action="store_true",
            help="list the shapes, bytes and rooflines without timing (any machine)",
        )
        _out(p, "record")

    kernels = kinds.add_parser("kernels", help="every kernel of one engine call (GPU)")
    kernels.add_argument("model", help="timm name, optionally with tag")
    add_config_args(kernels, BENCH_STUDY_OPTIONS)
    kernels.add_argument(
        "--fp8-kernel",
        choices=choices(Fp8Kernel),
        default=DEFAULT_FP8_KERNEL,
        help="the FP8 engine's",
    )
    kernels.add_argument("--batch", type=int, default=128, help="profiled batch (default 128)")
    kernels.add_argument("--compiles", type=int, default=2, help="fresh compiles (default 2)")
    kernels.add_argument(
        "--sources", type=int, default=6, help="Inductor kernel sources to copy per engine"
    )
    _out(kernels, "record (kernel sources go beside it)")

    _add_options_parser(kinds, add_config_args)

    for name, (_, what) in DELEGATED.items():
        # Their own parsers take every argument after the name (`quantstudy bench limit -h`).
        kinds.add_parser(name, help=what, add_help=False)

    report = kinds.add_parser("report", help="render a folder of bench records as Markdown")
    report.add_argument("folder", type=Path)
    report.add_argument("--write", action="store_true", help="also write it to FOLDER/README.md")


def _add_options_parser(
    kinds: argparse._SubParsersAction,
    add_config_args: Callable[[argparse.ArgumentParser, tuple[str, ...]], None],
) -> None:
    p = kinds.add_parser(
        "options", help="one recipe's layers under each FP8 quality option: quality (and speed)"
    )
    p.add_argument("model", help="timm name, optionally with tag")
    add_config_args(p, OPTIONS_STUDY_OPTIONS)
    # Variant names are checked by `compare_options` (listing them here would import torch).
    p.add_argument("--variants", nargs="*", default=None, help="variant names (default: all)")
    p.add_argument(
        "--engine-variants", nargs="*", default=[],
        help="variants whose FP8 engine is built and scored too (with the emulation's floors)",
    )  # fmt: skip
    p.add_argument(
        "--speed-batches", type=int, nargs="*", default=[],
        help="time the engine variants' FP8 engine against fp16 at these batches (GPU)",
    )  # fmt: skip
    p.add_argument(
        "--engine-dtypes", nargs="*", choices=ENGINE_DTYPES, default=[],
        help="also score the engine variants' FP8 engine in these compute dtypes (not timed)",
    )  # fmt: skip
    p.add_argument(
        "--storage-dtypes", nargs="*", choices=ENGINE_DTYPES[1:], default=[],
        help="run the engine variants' emulation stored in these dtypes (default: the engine's)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--out", type=Path, required=True, help="options table JSON to write")


def run_bench(
    args: argparse.Namespace, study_config: Callable[[], StudyConfig], argv: list[str]
) -> None:
    """Run the parsed `bench` subcommand; `study_config()` gives the config of its options,
    `argv` the command line its record names."""
    from quantstudy.bench.schema import write_record

    command = args.bench_command
    if command in DELEGATED:
        import importlib

        importlib.import_module(DELEGATED[command][0]).main(args.rest)
        return
    if command == "options":
        _run_options(args, study_config, argv)
        return
    if command == "report":
        from quantstudy.bench.report import render_folder, write_report

        if args.write:
            print(f"report: {write_report(args.folder)}")
        else:
            print(render_folder(args.folder), end="")
        return
    for name in ("rounds", "iters", "batch", "compiles"):
        if getattr(args, name, 1) < 1:
            raise UserError(f"--{name} must be at least 1")
    if command == "speed":
        from quantstudy.bench.speed import bench_speed

        record = bench_speed(
            study_config(),
            args.kernels,
            rounds=args.rounds,
            iters=args.iters,
            agreement=args.agreement,
            autotune_batch=args.fp16_autotune_batch,
            argv=argv,
        )
    elif command == "gemm":
        from quantstudy.bench.gemm import bench_gemm

        record = bench_gemm(
            args.model, args.recipe, args.batch, shapes_only=args.shapes_only,
            sweep=args.sweep, argv=argv, out=args.record,
        )  # fmt: skip
    elif command == "depthwise":
        from quantstudy.bench.depthwise import bench_depthwise

        record = bench_depthwise(
            args.model, args.batch, shapes_only=args.shapes_only, argv=argv, out=args.record
        )
    else:
        from quantstudy.bench.kernels import bench_kernels

        record = bench_kernels(
            study_config(), Fp8Kernel(args.fp8_kernel), args.batch, args.record.parent,
            compiles=args.compiles, sources=args.sources, argv=argv,
        )  # fmt: skip
    write_record(args.record, record)
    print(f"record: {args.record}")


def _run_options(
    args: argparse.Namespace, study_config: Callable[[], StudyConfig], argv: list[str]
) -> None:
    import torch

    from quantstudy.bench.options.compare import compare_options
    from quantstudy.record.io import write_json_atomic

    if args.threads:
        torch.set_num_threads(args.threads)
    result = compare_options(
        study_config(), args.variants, engine_variants=args.engine_variants,
        speed_batches=args.speed_batches, engine_dtypes=args.engine_dtypes,
        storage_dtypes=args.storage_dtypes, out=args.out, argv=argv,
    )  # fmt: skip
    write_json_atomic(args.out, result)
    print(f"options table: {args.out}")
