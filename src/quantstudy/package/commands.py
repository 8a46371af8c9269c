"""The `package` subcommand: its arguments and what it prints."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from quantstudy.cli_base.command import Command, batches
from quantstudy.record.errors import EXIT_COMMON, UserError
from quantstudy.record.readers import read_json
from quantstudy.record.vocab import Device


def _range(text: str) -> tuple[int, int]:
    """`--dynamic-batch MIN:MAX`: 1 <= MIN < MAX (one batch is a static package: --batches)."""
    low, sep, high = text.partition(":")
    try:
        if not sep:
            raise ValueError
        found = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a batch range looks like 1:128, not '{text}'") from None
    if not 1 <= found[0] < found[1]:
        raise argparse.ArgumentTypeError(
            f"a batch range needs 1 <= MIN < MAX, not {text} (one batch: --batches B)"
        )
    return found


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", type=Path)
    p.add_argument("--out", type=Path, help="folder to write (default STUDY_DIR/package)")
    shapes = p.add_mutually_exclusive_group()
    shapes.add_argument(
        "--batches", type=batches, help="one static package per batch (default: the study's)"
    )
    shapes.add_argument(
        "--dynamic-batch", type=_range, metavar="MIN:MAX", help="one package for any batch in it"
    )
    p.add_argument(
        "--device",
        choices=[str(d) for d in Device],
        default=str(Device.CUDA),
        help="cuda (default): the GPU engine the study timed; cpu: its CPU emulation, no FP8 speed",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run the packages without quantstudy and compare them with the study's FP8 engine "
        "(checks an existing --out folder instead of writing one)",
    )
    p.add_argument("--data", type=Path, help="folder of the study's held-out images")
    p.add_argument(
        "--calib-data", type=Path, help="random-weight studies: folder of the calibration images"
    )
    p.add_argument("--images", type=int, help="--check on the first N held-out images only")


def _run(args: argparse.Namespace) -> int:
    from quantstudy.study.guard import holding

    if args.images is not None and args.images < 1:
        raise UserError("--images must be at least 1")
    with holding(args.study_dir):  # as `run` holds it: never binds to a record being written
        return _package(args)


def _package(args: argparse.Namespace) -> int:
    from quantstudy.package import manifest as mf
    from quantstudy.package.build import PackageOptions, package_study

    if args.device == Device.CPU:
        # torch's C++ extension helper warns that it found no CUDA runtime as AOTInductor
        # imports it: true, and beside the point of a CPU package
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    options = PackageOptions(
        args.study_dir, args.out, args.batches, args.dynamic_batch, Device(args.device), args.data,
        args.calib_data,
    )  # fmt: skip
    folder = options.out_dir
    # --check of a folder holding a manifest: checked, never packaged over (a pipe or folder in
    # its place is refused by the check's reader, in one line)
    if not (args.check and (folder / mf.MANIFEST_FILE).exists()):
        folder = package_study(options)
        manifest = read_json(folder / mf.MANIFEST_FILE, "package manifest", "record")
        for entry in manifest["packages"]:
            print(f"{folder / entry['file']}: {entry['engine']}, {entry['bytes']} bytes")
        print(f"tiles: {len(manifest['tiles'])} FP8 launches, {manifest['tma_replaced']} moved "
              "from the TMA path to pointers")  # fmt: skip
        print(f"{folder / mf.MANIFEST_FILE}: bound to {manifest['bound_to']}")
    if not args.check:
        return 0
    from quantstudy.package.verify import check_package

    checked = check_package(folder, args.study_dir, args.data, args.calib_data, args.images)
    print("check:")
    print("\n".join(checked.result.lines()))
    print("\n".join(checked.lines))
    print("check passed" if checked.result else "check FAILED")
    return 0 if checked.result else 3


PACKAGE = Command(
    "compile the study's FP8 and fp16 engines into AOTInductor packages (.pt2)",
    _arguments,
    _run,
    f"exit status: 0 written (and --check passed), 3 --check failed, {EXIT_COMMON}",
)
