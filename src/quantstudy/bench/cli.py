"""The `quantstudy bench` subcommands, each registered the same way: one `Bench` in `BENCHES`.

A `Bench` is a help line, a function that adds its arguments (argparse only, so building the
parser imports no torch) and a function that runs it, importing its sibling module only then.
`bench` is one `Command` of the CLI's registry (`BENCH`); a bench takes the study options of
`study/cli_options.py`, with the same flags, help and checks as `quantstudy run`. Lab tools for
the GPU machine (probes of one kernel, stage times of whole studies) are scripts of the
repository's `tools/lab/bench/`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantstudy.bench import bound_check, gelu_forms, tune_compare, tuning_table
from quantstudy.bench.arg_types import kernel_options, kernels, ours, peers
from quantstudy.bench.peers.configs import Peer
from quantstudy.cli_base.command import Command, batches, command_line
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL
from quantstudy.record.vocab import choices
from quantstudy.study.cli_options import (
    MODEL_DATA_OPTIONS,
    STUDY_OPTIONS,
    add_config_args,
    model_config,
)

# The study options a speed or kernels bench takes: the study's, but those that shape a whole
# study (its FP8 kernel, float32 engine, policy, passes, package and folder).
BENCH_STUDY_OPTIONS = MODEL_DATA_OPTIONS + tuple(
    o
    for o in STUDY_OPTIONS
    if o not in ("fp8_kernel", "float32_engine", "policy", "speed", "quality", "package", "out")
)
# The study options of `bench peers`: a speed bench's, and the FP8 kernel of our engine.
PEERS_STUDY_OPTIONS = (*BENCH_STUDY_OPTIONS, "fp8_kernel")
# Compute dtypes of `bench options --engine-dtypes`; the half ones are its storage dtypes
# (float32 storage is the emulation itself).
ENGINE_DTYPES = ("float32", "float16", "bfloat16")
# The study options of `bench options`: the model, data, split and recipe (nothing it times
# depends on the rest).
OPTIONS_STUDY_OPTIONS = tuple(
    o for o in BENCH_STUDY_OPTIONS if o not in ("batches", "compile_mode")
)


def _out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", dest="record", type=Path, required=True, help=f"{what} JSON to write")


@dataclass(frozen=True)
class Context:
    """What a bench takes from the command beside its parsed arguments."""

    study_config: Callable[[], StudyConfig]  # the `StudyConfig` of the parsed study options
    argv: list[str]  # the command line its record names


@dataclass(frozen=True)
class Bench:
    """One `quantstudy bench NAME` subcommand."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Context], None]


def _at_least_one(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1")


def _write(path: Path, record: Any) -> None:
    from quantstudy.bench.schema import write_record

    write_record(path, record)
    print(f"record: {path}")


def _speed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm name, optionally with tag")
    add_config_args(p, BENCH_STUDY_OPTIONS)
    p.add_argument(
        "--kernels",
        type=kernels,
        default=None,
        help="FP8 engines to time against fp16, comma-separated (default: every backend that "
        f"runs on this machine, of {','.join(kernel_options()[:-1])})",
    )
    p.add_argument("--rounds", type=int, default=30, help="timing rounds (default 30)")
    p.add_argument("--iters", type=int, default=20, help="calls per round (default 20)")
    p.add_argument(
        "--agreement",
        action="store_true",
        help="top-1 agreement of the fused and scaled_mm engines on every held-out image",
    )
    p.add_argument(
        "--fp16-autotune-batch",
        type=int,
        help="also time fp16 under max-autotune against default mode at this batch (GPU)",
    )
    _out(p, "record")


def _run_speed(args: argparse.Namespace, context: Context) -> None:
    from quantstudy.bench.speed import bench_speed
    from quantstudy.quant.backends import usable

    _at_least_one(args, "rounds", "iters")
    record = bench_speed(
        context.study_config(), args.kernels or tuple(usable()),
        rounds=args.rounds, iters=args.iters,
        agreement=args.agreement, autotune_batch=args.fp16_autotune_batch, argv=context.argv,
    )  # fmt: skip
    _write(args.record, record)


def _depthwise_arguments(p: argparse.ArgumentParser) -> None:
    """The model's depthwise convs at one batch (random weights)."""
    p.add_argument("model", help="timm name (random weights: only shapes matter)")
    p.add_argument("--batch", type=int, default=128, help="batch (default 128)")
    p.add_argument(
        "--shapes-only",
        action="store_true",
        help="list the shapes, bytes and rooflines without timing (any machine)",
    )
    _out(p, "record")


def _products_arguments(p: argparse.ArgumentParser) -> None:
    from quantstudy.bench.product_row import PEER_ROWS

    p.add_argument(
        "rows", nargs="*", default=[str(row) for row in PEER_ROWS],
        help="model[:recipe] (default: the peers rows: " + " ".join(map(str, PEER_ROWS)) + ")",
    )  # fmt: skip
    p.add_argument("--batches", type=batches, default=(1, 128), help="default 1,128")
    p.add_argument("--sweep", action="store_true", help="also every tile on every I/O path")
    p.add_argument(
        "--no-other-sums", "--no-fast-accum", dest="no_other_sums", action="store_true",
        help="skip our variants that sum otherwise than the engines (promote128 where they sum "
        "fast; --no-fast-accum, its older name, reads the same)",
    )  # fmt: skip
    p.add_argument(
        "--no-persistent", action="store_true",
        help="skip our persistent tiles (level with ours at best on every product measured)",
    )  # fmt: skip
    p.add_argument("--resume", type=Path, help="keep the timed rows of this earlier record")
    p.add_argument("--budget", type=float, help="start no product after this many seconds")
    _out(p, "record")


def _run_products(args: argparse.Namespace, context: Context) -> None:
    from quantstudy.bench.products import bench_products
    from quantstudy.study.model_list import parse_model_args

    if min(args.batches) < 1:
        raise UserError(f"--batches must be at least 1, got {args.batches}")
    record = bench_products(
        parse_model_args(args.rows), args.batches, sweep=args.sweep,
        other_sums=not args.no_other_sums,
        persistent=not args.no_persistent,
        resume=args.resume, budget_s=args.budget, argv=context.argv, out=args.record,
    )  # fmt: skip
    _write(args.record, record)


def _run_depthwise(args: argparse.Namespace, context: Context) -> None:
    from quantstudy.bench.depthwise import bench_depthwise

    _at_least_one(args, "batch")
    record = bench_depthwise(
        args.model, args.batch, shapes_only=args.shapes_only, argv=context.argv, out=args.record
    )
    _write(args.record, record)


def _kernels_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm name, optionally with tag")
    add_config_args(p, BENCH_STUDY_OPTIONS)
    p.add_argument(
        "--fp8-kernel",
        choices=kernel_options(),
        default=DEFAULT_FP8_KERNEL,
        help="the FP8 engine's",
    )
    p.add_argument("--batch", type=int, default=128, help="profiled batch (default 128)")
    p.add_argument("--compiles", type=int, default=2, help="fresh compiles (default 2)")
    p.add_argument(
        "--sources", type=int, default=6, help="Inductor kernel sources to copy per engine"
    )
    _out(p, "record (kernel sources go beside it)")


def _run_kernels(args: argparse.Namespace, context: Context) -> None:
    from quantstudy.bench.kernels import bench_kernels

    _at_least_one(args, "batch", "compiles")
    record = bench_kernels(
        context.study_config(), args.fp8_kernel, args.batch, args.record.parent,
        compiles=args.compiles, sources=args.sources, argv=context.argv,
    )  # fmt: skip
    _write(args.record, record)


def _options_arguments(p: argparse.ArgumentParser) -> None:
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


def _run_options(args: argparse.Namespace, context: Context) -> None:
    import torch

    from quantstudy.bench.options.compare import compare_options
    from quantstudy.record.io import write_json_atomic

    if args.threads:
        torch.set_num_threads(args.threads)
    result = compare_options(
        context.study_config(), args.variants, engine_variants=args.engine_variants,
        speed_batches=args.speed_batches, engine_dtypes=args.engine_dtypes,
        storage_dtypes=args.storage_dtypes, out=args.out, argv=context.argv,
    )  # fmt: skip
    write_json_atomic(args.out, result)
    print(f"options table: {args.out}")


def _gelu_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm name, optionally with tag")
    add_config_args(p, OPTIONS_STUDY_OPTIONS)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    _out(p, "GELU forms record (its rows of other models are kept)")


def _peers_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="timm name, optionally with tag (or --rows)")
    add_config_args(p, PEERS_STUDY_OPTIONS)
    p.add_argument(
        "--rows", type=Path,
        help="YAML file of rows (model, recipe, weights) measured one after another into one "
        "record, instead of MODEL",
    )  # fmt: skip
    p.add_argument(
        "--torchao", type=peers, default=tuple(Peer),
        help=f"torchao configs, comma-separated, or none (default {','.join(choices(Peer))})",
    )  # fmt: skip
    p.add_argument(
        "--ours", type=ours, default=(),
        help="our engines, comma-separated kernel options (default: --fp8-kernel's and fastest)",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=30, help="timing rounds (default 30)")
    p.add_argument("--iters", type=int, default=20, help="calls per round (default 20)")
    p.add_argument(
        "--append", action="store_true",
        help="add the rows to the record at --out (measured alike), skipping the rows it holds",
    )  # fmt: skip
    p.add_argument("--max-rows", type=int, help="measure at most this many new rows")
    _out(p, "record")


def _run_peers(args: argparse.Namespace, context: Context) -> None:
    from quantstudy.bench.peers.cli import run_peers

    _at_least_one(args, "rounds", "iters")
    if args.max_rows is not None:
        _at_least_one(args, "max_rows")
    _write(args.record, run_peers(args, context.study_config, context.argv))


def _peers_merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("records", type=Path, nargs="+", metavar="RECORD", help="peers records")
    _out(p, "merged record")


def _run_peers_merge(args: argparse.Namespace, _: Context) -> None:
    from quantstudy.bench.peers.alike import merge_records

    _write(args.record, merge_records(args.records))


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path)
    p.add_argument("--write", action="store_true", help="also write it to FOLDER/README.md")


def _run_report(args: argparse.Namespace, _: Context) -> None:
    from quantstudy.bench.report import render_folder, write_report

    if args.write:
        print(f"report: {write_report(args.folder)}")
    else:
        print(render_folder(args.folder), end="")


BENCHES: dict[str, Bench] = {
    "speed": Bench(
        "time the fp16 engine against each FP8 engine of a study (GPU; CPU: a check)",
        _speed_arguments,
        _run_speed,
    ),
    "products": Bench(
        "every FP8 product of several models and batches: ours beside cuBLASLt and cuBLAS (GPU)",
        _products_arguments,
        _run_products,
    ),
    "depthwise": Bench(
        "each depthwise conv alone: cuDNN fp16 against the Triton kernel (GPU)",
        _depthwise_arguments,
        _run_depthwise,
    ),
    "kernels": Bench("every kernel of one engine call (GPU)", _kernels_arguments, _run_kernels),
    "options": Bench(
        "one recipe's layers under each FP8 quality option: quality (and speed)",
        _options_arguments,
        _run_options,
    ),
    "gelu": Bench(
        "cuBLASLt's tanh GELU against erf on the emulation: FP8 codes and agreement differing",
        _gelu_arguments,
        gelu_forms.run,
    ),
    "peers": Bench(
        "fp16, our FP8 engine and torchao's float8 configs on the same layers and images",
        _peers_arguments,
        _run_peers,
    ),
    "peers-merge": Bench(
        "the rows of peers records measured alike (the GPUs of one host side by side) as one",
        _peers_merge_arguments,
        _run_peers_merge,
    ),
    "report": Bench("render a folder of bench records as Markdown", _report_arguments, _run_report),
    "tuning-table": Bench(
        "the shipped tuning table of each GPU in a machine's store of tuned choices",
        tuning_table.arguments,
        tuning_table.run,
    ),
    "bound-check": Bench(
        "where each tuned winner of a products record ranks in a config bound's order (records)",
        bound_check.arguments,
        bound_check.run,
    ),
    "tune-compare": Bench(
        "two products records tuned two ways, column by column, and their tuning logs (records)",
        tune_compare.arguments,
        tune_compare.run,
    ),
}


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    kinds = p.add_subparsers(dest="bench_command", required=True)
    for name, entry in BENCHES.items():
        entry.arguments(kinds.add_parser(name, help=entry.help))


def _run_bench(args: argparse.Namespace) -> None:
    """Run the parsed `bench` subcommand."""
    BENCHES[args.bench_command].run(args, Context(lambda: model_config(args), command_line(args)))


BENCH = Command("benchmarks: " + ", ".join(BENCHES), _bench_arguments, _run_bench)
