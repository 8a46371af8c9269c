"""`quantstudy package STUDY_DIR`: the study's FP8 and fp16 engines compiled ahead of time.

The engines are rebuilt from the record alone (`bridge/rebuild.py`: the study's weights, checked
by digest, its plan and calibrated scales), built as the study built them
(`engines/builders.py`), exported with `torch.export` at each batch (or once with a dynamic
batch), the FP8 ops pointed at their packaged ops (`package/graph.py`), and compiled with
AOTInductor into `.pt2` packages, with the Inductor options of the study's compile mode. On
CUDA the FP8 kernels' tiles are autotuned first, on the study's engine, at each batch, and
recorded by the launchers themselves (`quant/kernels/launches.py`).

Everything is written into a temporary folder beside `--out`, which becomes `--out` by one
rename when the last file is in: an interrupted or failed run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quantstudy.bridge.rebuild import Rebuilt, rebuild
from quantstudy.data.folders import ImageItem
from quantstudy.data.images import load_images
from quantstudy.engines.builders import BuiltEngine, build_fp8, build_half
from quantstudy.env.machine import gpu_capability, gpu_name, torch_version
from quantstudy.model.loading import sha256_file
from quantstudy.model.preprocess import build_transform
from quantstudy.package import manifest as mf
from quantstudy.package.graph import export_engine, retarget
from quantstudy.quant.kernels import launches
from quantstudy.quant.private_api import aoti_compile_and_package
from quantstudy.record import EngineInfo, StudyRecord
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import FASTEST, CompileMode, Device, Engine
from quantstudy.study.per_image import set_ids

SAMPLE_IMAGES = 4  # recorded images whose outputs the manifest fingerprints
FP8_CAPABILITY = (8, 9)  # Ada and Hopper on: the first GPUs with FP8 tensor cores
# The oldest torch shown to compile a CPU package of an FP8 emulation with AOTInductor (2.14.1):
# torch 2.11's CPU wrapper declares kernels on `at::Float8_e4m3fn` without including its header
# (a C++ compile error); 2.12 and 2.13 were not tried (docs/VERSIONS.md).
CPU_PACKAGE_TORCH = (2, 14)


@dataclass(frozen=True)
class PackageOptions:
    """What `quantstudy package` was asked for. `batches` None and `dynamic` None: the
    study's timed batches, one static package each."""

    study_dir: Path
    out: Path | None = None
    batches: tuple[int, ...] | None = None
    dynamic: tuple[int, int] | None = None
    device: Device = Device.CUDA
    data: Path | None = None
    calib_data: Path | None = None

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out is not None else Path(self.study_dir) / "package"


def fp8_engine_info(record: StudyRecord) -> EngineInfo:
    """The record's FP8 engine; a study without one is refused."""
    info = record.engine(Engine.FP8)
    if info is None or (not info.fp8_real and not info.fp8_emulated):
        raise UserError(
            f"study {record.name} has no FP8 engine to package (status {record.status}); "
            "package a study that got past its engines"
        )
    return info


def check_device(record: StudyRecord, device: Device) -> torch.device:
    """The device to package for, refused where it cannot carry the study's FP8 engine."""
    info = fp8_engine_info(record)
    if device == Device.CPU:
        if torch.torch_version.TorchVersion(torch_version()) < CPU_PACKAGE_TORCH:
            raise UserError(
                f"packaging the CPU emulation needs torch {'.'.join(map(str, CPU_PACKAGE_TORCH))}"
                f" or later (torch {torch_version()}'s AOTInductor writes a CPU wrapper that "
                "cannot name float8 types); package on a GPU, or upgrade torch"
            )
        return torch.device("cpu")
    if not info.device.startswith("cuda"):
        raise UserError(
            f"study {record.name} ran its FP8 engine on {info.device}: there is no GPU FP8 "
            "engine to package; rerun the study on a GPU, or pass --device cpu to package the "
            "CPU emulation (no FP8 speed)"
        )
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: package on the GPU the packages will run on")
    cuda = torch.device("cuda")
    capability = gpu_capability(cuda)
    if capability < FP8_CAPABILITY:
        raise UserError(
            f"{gpu_name(cuda)} (compute capability {capability[0]}.{capability[1]})"
            " has no FP8 tensor cores (8.9 or newer needed): package on the GPU that will run it"
        )
    return cuda


def _refuse_options(record: StudyRecord) -> None:
    if record.config.fp8_kernel == FASTEST:
        raise UserError(
            f"study {record.name} chose each layer's FP8 kernel by timing it (--fp8-kernel "
            "fastest); package supports the fused and scaled_mm engines, whose layers are "
            "fixed by the record"
        )


def sample_images(
    study_dir: Path, record: StudyRecord, data: Path | None
) -> tuple[torch.Tensor, list[str]]:
    """The first few held-out images of the study, preprocessed as the study did."""
    images = record.data.heldout
    root = Path(data) if data is not None else Path(images.folder)
    ids = set_ids(study_dir, record, images)[:SAMPLE_IMAGES]
    missing = [i for i in ids if not (root / i).is_file()]
    if missing:
        raise UserError(
            f"the study's held-out image {missing[0]} is not in {root}; pass the folder the "
            "study read with --data"
        )
    items = [ImageItem(id=i, path=root / i, label=None, wnid=None) for i in ids]
    x, _ = load_images(items, build_transform(record.preprocessing), desc="sample images")
    return x, ids


def batch_plan(record: StudyRecord, options: PackageOptions) -> list[tuple[int | None, list[int]]]:
    """(static batch or None for the dynamic package, batches it is timed at)."""
    study = sorted(record.config.batches)
    if options.dynamic is not None:
        low, high = options.dynamic
        if not 1 <= low <= high:
            raise UserError(f"--dynamic-batch {low}:{high}: give MIN:MAX with 1 <= MIN <= MAX")
        return [(None, [b for b in study if low <= b <= high] or [high])]
    batches = sorted(set(options.batches or study))
    if batches[0] < 1:
        raise UserError("--batches must be positive")
    return [(b, [b]) for b in batches]


def export_batch(batch: int | None, timed: list[int]) -> int:
    """The batch a package is exported at: its own, or the dynamic package's largest timed
    batch and at least 2: torch.export makes a dimension of size 1 a constant and then refuses
    the range (a range's MAX is at least 2: `commands.py`)."""
    return batch or max(*timed, 2)


def inductor_configs(record: StudyRecord) -> dict[str, object]:
    """AOTInductor's options for the study's compile mode (max-autotune: tuned templates).

    `always_keep_tensor_constants`: Inductor otherwise turns a 0-d constant (a layer's
    per-tensor activation or output scale buffer) into an inlined scalar, and a Triton kernel
    that reads that scale through a pointer then fails to compile (torch 2.11: "'<=' not
    supported between instances of 'Constant' and 'int'"). Both engines get it, so the fp16
    package is compiled under the same rules as the FP8 one."""
    configs: dict[str, object] = {"always_keep_tensor_constants": True}
    if CompileMode(record.config.compile_mode) == CompileMode.MAX_AUTOTUNE:
        configs["max_autotune"] = True
    return configs


@dataclass
class Engines:
    fp16: BuiltEngine
    fp8: BuiltEngine


def study_spec(record: StudyRecord) -> BuildSpec:
    """The build spec of the study's FP8 engine: its config, summing as it did, under the lab
    switches it ran under (`StudyConfig.build_spec`, `recorded`)."""
    return record.build_spec(replay_choice=False)


def build_engines(rebuilt: Rebuilt, device: torch.device) -> Engines:
    """The study's fp16 and FP8 engines as the study built them: `eager` is what gets
    exported, `module` the engine compiled as the study compiled it (on CUDA)."""
    record = rebuilt.record
    example = rebuilt.example
    mode = record.config.compile_mode
    fp16 = build_half(rebuilt.model, device, example, fold=rebuilt.fold_bn, compile_mode=mode)
    fp8 = build_fp8(
        rebuilt.model, device, example, rebuilt.plan, fold=rebuilt.fold_bn, compile_mode=mode,
        spec=study_spec(record),
    )  # fmt: skip
    return Engines(fp16, fp8)


def choose_tiles(
    engine: BuiltEngine, images: torch.Tensor, batches: list[int]
) -> launches.LaunchRecord:
    """Run the study's FP8 engine at each batch (ascending: under a dynamic batch the largest
    wins), autotuning each FP8 launch as the study does but among the pointer paths alone (the
    packaged ops launch through pointers: `launches.pointers_only`), and return the launch
    record: the tile each launch ran with, which the packaged ops are compiled with. Every tile
    the prune keeps writes the same bits, so the package still computes the study's logits."""
    from quantstudy.speed.harness import tile_images

    with launches.recording() as record, launches.pointers_only(), torch.no_grad():
        for b in sorted(batches):
            engine.eager(engine.prepare(tile_images(images, b)))
        torch.cuda.synchronize()
    return record


def compile_package(
    module: torch.nn.Module,
    example: torch.Tensor,
    dynamic: tuple[int, int] | None,
    path: Path,
    configs: dict[str, object],
) -> dict[str, int]:
    """Export `module` (an engine's eager module) for `example` (prepared), retarget its FP8
    ops, compile it to `path`; returns the FP8 ops retargeted, by name."""
    program = export_engine(module, example, dynamic)
    counts = retarget(program)
    with torch.no_grad():
        aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
    return counts


def _entry(
    path: Path,
    engine: BuiltEngine,
    batch: int | None,
    dynamic: tuple[int, int] | None,
    timed: list[int],
    out_shape: list[int],
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "file": path.name,
        "engine": engine.name,
        "batch": batch,
        "min_batch": dynamic[0] if dynamic else batch,
        "max_batch": dynamic[1] if dynamic else batch,
        "timed_batches": timed,
        "input_dtype": str(engine.dtype).removeprefix("torch."),
        "output_shape": ["batch" if batch is None else batch, *out_shape[1:]],
        "output_dtype": str(engine.dtype).removeprefix("torch."),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }
    return entry


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` that becomes `out` when the block completes, and is
    removed when it does not."""
    out = Path(out)
    if out.exists():
        raise UserError(
            f"{out} exists; choose another --out or remove it (add --check to check the "
            "package already in it)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def package_study(options: PackageOptions) -> Path:
    """Write the packages, the sample images, the check script and the manifest; return the
    folder. The packaged FP8 engine computes what the study's did (`study_spec`)."""
    record = load_record(Path(options.study_dir) / RECORD_FILE)
    return _package(options, record)


def _package(options: PackageOptions, record: StudyRecord) -> Path:
    fp8_engine_info(record)
    _refuse_options(record)
    device = check_device(record, options.device)
    plan = batch_plan(record, options)
    if options.out_dir.exists():  # refused before minutes of work (`_staging` again at the end)
        with _staging(options.out_dir):
            pass
    rebuilt = rebuild(record, options.data, options.calib_data)
    images, ids = sample_images(Path(options.study_dir), record, options.data)
    engines = build_engines(rebuilt, device)
    all_batches = sorted({b for _, timed in plan for b in timed} | {b for b, _ in plan if b})
    tiles = choose_tiles(engines.fp8, images, all_batches) if device.type == "cuda" else None
    configs = inductor_configs(record)
    from quantstudy.speed.harness import tile_images

    started = time.perf_counter()
    with _staging(options.out_dir) as stage:
        entries: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        for batch, timed in plan:
            size = export_batch(batch, timed)
            tag = f"b{batch}" if options.dynamic is None else "b{}-{}".format(*options.dynamic)
            for engine in (engines.fp8, engines.fp16):
                x = engine.prepare(tile_images(images, size))
                path = stage / f"{engine.name}-{tag}.pt2"
                with launches.replaying(tiles) if tiles is not None else contextlib.nullcontext():
                    got = compile_package(engine.eager, x, options.dynamic, path, configs)
                counts = counts or got
                with torch.no_grad():
                    out_shape = list(engine.eager(x).shape)
                entries.append(_entry(path, engine, batch, options.dynamic, timed, out_shape))
                if engine.name == Engine.FP16:
                    entries[-1]["twin_of"] = entries[-2]["file"]
                else:
                    entries[-1]["twin_of"] = None
        torch.save(images, stage / mf.SAMPLE_FILE)
        (stage / mf.CHECK_SCRIPT).write_text(
            Path(__file__).with_name("shipped_check.py").read_text(encoding="utf-8")
        )
        manifest: dict[str, Any] = {
            "manifest_version": mf.MANIFEST_VERSION,
            "study": mf.study_part(record),
            "preprocessing": mf.preprocessing_part(record),
            "input": {
                "shape": ["batch", *record.preprocessing.input_size],
                "dtype": str(engines.fp8.dtype).removeprefix("torch."),
                "memory_format": "channels_last" if engines.fp8.channels_last else "contiguous",
                "what": "preprocessed images (the preprocessing above), cast and laid out so",
            },
            "bound_to": mf.bound_to(device),
            "versions": mf.versions(),
            "inductor_configs": configs,
            "packages": entries,
            "fp8_ops": counts,
            "tiles": tiles.rows() if tiles is not None else [],
            "tma_replaced": tiles.tma_replaced if tiles is not None else 0,
            "sample": {"file": mf.SAMPLE_FILE, "ids": ids},
            "compile_s": round(time.perf_counter() - started, 1),
        }
        write_json_atomic(stage / mf.MANIFEST_FILE, manifest)
        from quantstudy.package.loader import sample_outputs

        manifest["sample"] |= sample_outputs(stage)
        write_json_atomic(stage / mf.MANIFEST_FILE, manifest)
    return options.out_dir
