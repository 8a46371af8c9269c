"""The timing harness: fp16 against FP8 engines, one engine call at a time, rounds interleaved.

What is timed (on CUDA), exactly:
- The timed unit is one engine call: `engine.module(x)` on an input `x` that already lives on the
  GPU in the engine's dtype and memory format (`engine.prepare` ran before timing). No host
  transfer, no preprocessing, no output copy, no synchronisation is inside.
- Each call is captured once in a CUDA graph (after eager warm-up calls on a side stream, as the
  PyTorch CUDA graph documentation prescribes, so compilation and autotuning happen before capture)
  and replayed; replay removes the host's launch cost, as a deployed graph-captured engine would.
- A round is `iters` replays between two CUDA events; ms per call = elapsed / iters. One
  synchronisation follows each round, outside the events.
- Rounds of the engines alternate, ABBA: in the order given in even rounds, reversed in odd
  rounds (any number of engines, each paired with the same fp16 rounds). Round i of fp16 and of
  an FP8 engine are neighbours in time and form a pair for the ratio (`stats.py`); swapping the
  order every round cancels a linear drift (clocks, temperature) that would bias every pair.
- Inputs are real preprocessed images (tiled when there are fewer than the batch). Replays rotate
  over up to `max_buffers` input buffers holding different images, one graph captured per buffer,
  all graphs of an engine sharing one memory pool (so intermediate activations reuse the same
  memory from call to call, as in one deployed engine; only input and output differ). The number
  of buffers is the largest that (a) does not exceed `max_buffers`, (b) fits, all buffers of one
  engine together, in the GPU's L2 cache, so the rotated inputs could all stay cache-resident as
  a single input could (the rotation varies the pixels; it is not meant to flush the cache), and
  (c) gives each buffer different images. At large batches this is 1.
- `iters` is fixed (not adapted to the call's duration) so every round of every batch has the same
  structure; at 20 replays of even a 0.1 ms call a round spans 2 ms, far above the ~0.5 us
  resolution of CUDA events.

The engines must not capture CUDA graphs of their own (torch.compile's "reduce-overhead" and
"max-autotune" modes do; "max-autotune-no-cudagraphs" does not): the harness captures the call
itself, and Inductor's graphs would be captured inside ours, which is not a supported setup.
`compile_mode` is only recorded here, as the engines' builder names it. The engines should be
compiled for static shapes (`dynamic=False`): after a second batch size, automatic dynamic
shapes would otherwise time a shape-generic kernel.

On CPU the same interleaved rounds run eagerly with `time.perf_counter` and few rounds; the section
is marked not meaningful and has no kernel profile.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from quantstudy.engines.base import Engine
from quantstudy.engines.interleaved import (
    CAPTURE_WARMUP_MIN,
    Variants,
    check_counts,
    time_interleaved,
)
from quantstudy.engines.size import package_bytes, weight_bytes
from quantstudy.env.machine import gpu_name
from quantstudy.gpu.timing_lock import timing
from quantstudy.record import BatchSpeed, KernelBreakdown, SpeedSection
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.speed.clocks import gpu_clocks
from quantstudy.speed.kernels import profile_kernels
from quantstudy.speed.stats import summarize_batch

MAX_INPUT_BUFFERS = 4
"""Default upper bound on the rotated input buffers per engine and batch."""

CPU_ROUNDS, CPU_ITERS, CPU_WARMUP = 3, 2, 1
"""Caps on CPU: CPU timings are not evidence, so they are kept short."""

CPU_MEANINGLESS_REASON = "timed on CPU: not evidence for a GPU deployment decision"


def input_buffer_count(
    input_bytes: int, l2_bytes: int | None, n_images: int, batch: int, max_buffers: int
) -> int:
    """How many rotated input buffers: within `max_buffers`, within L2 together, distinct images.

    `l2_bytes` None (CPU) means no rotation: 1 buffer.
    """
    if l2_bytes is None:
        return 1
    fit_l2 = l2_bytes // max(input_bytes, 1)
    distinct = n_images // batch
    return max(1, min(max_buffers, fit_l2, distinct))


def tile_images(images: torch.Tensor, batch: int, offset: int = 0) -> torch.Tensor:
    """`batch` images starting at `offset`, wrapping around (repeating) when `images` is short."""
    index = (torch.arange(batch) + offset) % images.shape[0]
    return images[index].contiguous()


def engine_weight_bytes(engine: Engine) -> int:
    """Weight bytes of the engine's module (through `size.weight_bytes`), else of its info()."""
    if isinstance(engine.module, torch.nn.Module):
        return weight_bytes(engine.module)
    return engine.info().weight_bytes


def timed_region_text(
    *,
    on_gpu: bool,
    compile_mode: str,
    rounds: int,
    iters: int,
    warmup: int,
    buffers: Mapping[int, int],
    n_images: int,
    engines: Sequence[str] = (EngineName.FP16, EngineName.FP8),
) -> str:
    """The one-sentence description of what each timing contains, for the record and report;
    `engines`: the names in the order their rounds take in even rounds."""
    order = _round_order(engines)
    if not on_gpu:
        return (
            f"direct call of the engine's module (compile mode '{compile_mode}') on a CPU input "
            f"already cast to the engine's dtype and memory format; {iters} calls timed with "
            f"time.perf_counter per round, ms per call = elapsed / {iters}; {rounds} rounds per "
            f"engine after {warmup} warm-up call(s); {order}; inputs from {n_images} real "
            "preprocessed images, repeated when fewer than the "
            "batch; no CUDA graphs and no kernel profile (the profiler groups CUDA kernels only)"
        )
    per_batch = ", ".join(f"batch {b}: {n}" for b, n in buffers.items())
    return (
        "CUDA graph replay of one engine call (the engine's module forward, compile mode "
        f"'{compile_mode}', on a device-resident input already cast to the engine's dtype and "
        "memory format); no host transfer, no preprocessing, no synchronisation inside; "
        f"{iters} replays between two CUDA events per round, ms per call = elapsed / {iters}; "
        f"{rounds} rounds per engine after {max(warmup, CAPTURE_WARMUP_MIN)} eager warm-up "
        f"calls before capture and {warmup} warm-up replays of each graph; {order}, one "
        "synchronisation after each round, outside the timed region; inputs from "
        f"{n_images} real preprocessed images, repeated when fewer than the batch; replays rotate "
        "over input buffers holding different images, one graph per buffer, the graphs of an "
        f"engine sharing one memory pool (buffers per engine: {per_batch})"
    )


def cpu_counts(rounds: int, iters: int, warmup: int) -> tuple[int, int, int]:
    """Rounds, calls per round and warm-up calls capped for a CPU run (`CPU_ROUNDS`...)."""
    return min(rounds, CPU_ROUNDS), min(iters, CPU_ITERS), min(warmup, CPU_WARMUP)


def time_batch(
    engines: Mapping[str, Engine],
    images: torch.Tensor,
    batch: int,
    *,
    rounds: int,
    iters: int,
    warmup: int,
    l2_bytes: int | None,
    max_buffers: int = MAX_INPUT_BUFFERS,
) -> tuple[dict[str, list[float]], int]:
    """Every engine of `engines` (name -> engine, one device) at `batch`, rounds interleaved in
    the mapping's order (`time_interleaved`), each on its own prepared copy of the same rotated
    input buffers (`input_buffer_count`, `tile_images`); (ms per call per round by name, the
    number of buffers). The module docstring says what one timing holds."""
    first = tile_images(images, batch)
    probe = {name: engine.prepare(first) for name, engine in engines.items()}
    input_bytes = max(x.numel() * x.element_size() for x in probe.values())
    n_buffers = input_buffer_count(input_bytes, l2_bytes, images.shape[0], batch, max_buffers)
    host = [tile_images(images, batch, k * batch) for k in range(1, n_buffers)]
    calls: dict[str, Variants] = {
        name: [
            functools.partial(engine.module, x)
            for x in [probe[name]] + [engine.prepare(h) for h in host]
        ]
        for name, engine in engines.items()
    }
    device = next(iter(engines.values())).device
    with torch.no_grad():
        return time_interleaved(calls, rounds, iters, warmup, device=device), n_buffers


def _check_inputs(engines: Mapping[str, Engine], images: torch.Tensor, batches: list[int]) -> None:
    if images.ndim != 4 or images.shape[0] < 1 or images.dtype != torch.float32:
        raise ValueError(
            f"images must be a non-empty float32 NCHW batch, got {tuple(images.shape)} "
            f"{images.dtype}"
        )
    if images.device.type != "cpu":
        raise ValueError(f"images must be on the CPU, got {images.device}")
    if not batches or any(b < 1 for b in batches) or len(set(batches)) != len(batches):
        raise UserError(f"batch sizes must be distinct positive integers, got {batches}")
    if len(engines) < 2:
        raise ValueError("timing needs the fp16 engine and at least one other")
    base, *others = engines.values()
    for other in others:
        if other.device != base.device:
            raise ValueError(f"engines on different devices: {base.device} and {other.device}")
        if other.name == base.name:
            raise ValueError(f"an engine has the fp16 engine's name {base.name!r}")


def _round_order(engines: Sequence[str]) -> str:
    """How the engines' rounds alternate, in words (the study's two engines as it always said)."""
    if tuple(engines) == (EngineName.FP16, EngineName.FP8):
        return (
            "fp16 and fp8 rounds alternate in ABBA order (fp16 first in even rounds, fp8 first "
            "in odd rounds)"
        )
    return (
        f"the rounds of {', '.join(engines)} alternate in ABBA order (in this order in even "
        "rounds, reversed in odd rounds)"
    )


def clock_snapshot(start: dict[str, str], end: dict[str, str]) -> dict[str, str]:
    """Static fields once; fields that move (clocks, power, temperature) at start and end."""
    static = ("name", "driver_version", "clocks.max.sm", "gpu_match")
    clocks = {key: value for key, value in start.items() if key in static}
    for label, snapshot in (("start", start), ("end", end)):
        for key, value in snapshot.items():
            if key not in static:
                clocks[f"{key} ({label})"] = value
    return clocks


def measure_speed(
    engines: Mapping[str, Engine],
    images: torch.Tensor,
    batches: list[int],
    *,
    rounds: int = 30,
    iters: int = 20,
    warmup: int = 10,
    compile_mode: str,
    kernel_profile: bool = True,
    max_buffers: int = MAX_INPUT_BUFFERS,
    package_dir: Path | None = None,
) -> dict[str, SpeedSection]:
    """Time the first engine of `engines` (fp16) against each other at each batch size, all in
    one set of interleaved rounds; one speed section per other engine, by its key, pairing its
    rounds with the same fp16 rounds (a study times two: `{"fp16": ..., "fp8": ...}`).
    `images`: real preprocessed images, float32 NCHW on the CPU. On CUDA: CUDA-graph
    interleaved timing (module docstring), a kernel profile of one call of fp16 and of each
    engine per batch when `kernel_profile`, and, when `package_dir` is given, the AOTInductor
    package size of each engine at the first batch size (minutes). On CPU: a short eager run,
    marked not meaningful, with no kernel profile and no package.
    """
    _check_inputs(engines, images, batches)
    check_counts(rounds, iters, warmup)
    names = list(engines)
    base, others = engines[names[0]], names[1:]
    device = base.device
    on_gpu = device.type == "cuda"
    l2_bytes: int | None = None
    if on_gpu:
        if not torch.cuda.is_available():
            raise UserError(f"the engines are on {device} but no CUDA GPU is available")
        l2_bytes = int(torch.cuda.get_device_properties(device).L2_cache_size)
    else:
        rounds, iters, warmup = cpu_counts(rounds, iters, warmup)

    clocks_start = gpu_clocks(device) if on_gpu else {}
    results: dict[str, list[BatchSpeed]] = {n: [] for n in others}
    kernels: dict[str, list[KernelBreakdown]] = {n: [] for n in others}
    buffers: dict[int, int] = {}
    for batch in batches:
        times, buffers[batch] = time_batch(
            engines, images, batch, rounds=rounds, iters=iters, warmup=warmup,
            l2_bytes=l2_bytes, max_buffers=max_buffers,
        )  # fmt: skip
        for name in others:
            results[name].append(summarize_batch(batch, times[names[0]], times[name]))
        if on_gpu and kernel_profile:
            first = tile_images(images, batch)
            with timing():  # kernel durations, too, with the GPU held alone
                fp16 = profile_kernels(base, first, batch)
                for name in others:
                    kernels[name] += [fp16, profile_kernels(engines[name], first, batch)]
    clocks_end = gpu_clocks(device) if on_gpu else {}
    packages = _packages(engines, images, batches[0], package_dir) if on_gpu else None
    region = timed_region_text(
        on_gpu=on_gpu, compile_mode=compile_mode, rounds=rounds, iters=iters, warmup=warmup,
        buffers=buffers, n_images=int(images.shape[0]), engines=names,
    )  # fmt: skip
    where = f"{device} ({gpu_name(device)})" if on_gpu else str(device)
    return {
        name: SpeedSection(
            device=where,
            meaningful=on_gpu,
            meaningless_reason=None if on_gpu else CPU_MEANINGLESS_REASON,
            compile_mode=compile_mode,
            timed_region=region,
            rounds=rounds,
            iters_per_round=iters,
            warmup=warmup,
            input_buffers=max(buffers.values()),
            clocks=clock_snapshot(clocks_start, clocks_end) if clocks_start else {},
            batches=results[name],
            kernels=kernels[name],
            weight_bytes={e.name: engine_weight_bytes(e) for e in (base, engines[name])},
            package_bytes=packages and {e.name: packages[e.name] for e in (base, engines[name])},
        )
        for name in others
    }


def _packages(
    engines: Mapping[str, Engine], images: torch.Tensor, batch: int, package_dir: Path | None
) -> dict[str, int] | None:
    """The AOTInductor package size of each engine at `batch`, by engine name; None: not asked."""
    if package_dir is None:
        return None
    packages = {}
    example = tile_images(images, batch)
    for engine in engines.values():
        if not isinstance(engine.module, torch.nn.Module):
            raise TypeError(f"{engine.name}: packaging needs an nn.Module, not a callable")
        path = Path(package_dir) / f"{engine.name}_b{batch}.pt2"
        packages[engine.name] = package_bytes(engine.module, engine.prepare(example), path)
    return packages


def speed_not_run(section: SpeedSection) -> list[str]:
    """Plain statements of what a speed section did not measure, for StudyRecord.not_run."""
    missing = []
    if not section.meaningful:
        missing.append(f"GPU timing ({section.meaningless_reason})")
    if not section.kernels:
        if section.meaningful:
            missing.append("kernel time per group (kernel profile not requested)")
        else:
            missing.append("kernel time per group (CPU run; the profiler groups CUDA kernels only)")
    if section.package_bytes is None:
        missing.append("compiled package size (AOTInductor package not built)")
    return missing
