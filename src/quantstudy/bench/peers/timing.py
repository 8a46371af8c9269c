"""Every engine of a row in one set of interleaved rounds, as one speed section per FP8 engine.

The study's harness times two engines, fp16 and FP8, in ABBA rounds (`speed/harness.py`). Here
the same per-batch timing (`time_batch`: CUDA-graph replay, rotated input buffers, ms per call
per round) runs every engine of the row in one set of rounds, fp16 first in even rounds and
last in odd ones, so each FP8 engine's x = fp16 / FP8 is paired round by round with the same
fp16 rounds, and every engine saw the same clocks. Each FP8 engine's section is then what a
study would record for it against fp16 (`summarize_batch`; on CUDA the kernel profile of one
call of fp16 and of that engine per batch), which is what `speed/ideal.py` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from quantstudy.engines.base import Engine
from quantstudy.record import BatchSpeed, KernelBreakdown, SpeedSection
from quantstudy.record.vocab import CompileMode
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.speed.clocks import gpu_clocks
from quantstudy.speed.harness import (
    CPU_MEANINGLESS_REASON,
    MAX_INPUT_BUFFERS,
    clock_snapshot,
    cpu_counts,
    engine_weight_bytes,
    tile_images,
    time_batch,
    timed_region_text,
)
from quantstudy.speed.kernels import profile_kernels
from quantstudy.speed.stats import summarize_batch


def time_engines(
    engines: Mapping[str, Engine],
    images: torch.Tensor,
    batches: Sequence[int],
    *,
    rounds: int,
    iters: int,
    compile_mode: CompileMode,
    warmup: int = 10,
    max_buffers: int = MAX_INPUT_BUFFERS,
) -> dict[str, SpeedSection]:
    """The first engine of `engines` (the fp16 one) against each other, by name (module
    docstring). `images`: float32 NCHW on the CPU. On a CPU the rounds are few and eager, and
    the sections are marked not meaningful (no kernel profile), as the study marks them."""
    names = list(engines)
    if len(names) < 2:
        raise ValueError("time_engines needs the fp16 engine and at least one other")
    base = names[0]
    device = engines[base].device
    on_gpu = device.type == "cuda"
    l2_bytes = int(torch.cuda.get_device_properties(device).L2_cache_size) if on_gpu else None
    if not on_gpu:
        rounds, iters, warmup = cpu_counts(rounds, iters, warmup)
    clocks_start = gpu_clocks(device) if on_gpu else {}
    speeds: dict[str, list[BatchSpeed]] = {n: [] for n in names[1:]}
    kernels: dict[str, list[KernelBreakdown]] = {n: [] for n in names[1:]}
    buffers: dict[int, int] = {}
    for batch in batches:
        print(f"timing {', '.join(names)} at batch {batch}", flush=True)
        times, buffers[batch] = time_batch(
            engines, images, batch, rounds=rounds, iters=iters, warmup=warmup,
            l2_bytes=l2_bytes, max_buffers=max_buffers,
        )  # fmt: skip
        for name in names[1:]:
            speeds[name].append(summarize_batch(batch, times[base], times[name]))
        if on_gpu:
            first = tile_images(images, batch)
            fp16 = profile_kernels(engines[base], first, batch)
            for name in names[1:]:
                kernels[name] += [fp16, profile_kernels(engines[name], first, batch)]
    clocks = clock_snapshot(clocks_start, gpu_clocks(device)) if on_gpu else {}
    region = timed_region_text(
        on_gpu=on_gpu, compile_mode=compile_mode, rounds=rounds, iters=iters, warmup=warmup,
        buffers=buffers, n_images=int(images.shape[0]), engines=names,
    )  # fmt: skip
    gpu = f"{device} ({torch.cuda.get_device_name(device)})" if on_gpu else str(device)
    return {
        name: SpeedSection(
            device=gpu,
            meaningful=on_gpu,
            meaningless_reason=None if on_gpu else CPU_MEANINGLESS_REASON,
            compile_mode=compile_mode,
            timed_region=region,
            rounds=rounds,
            iters_per_round=iters,
            warmup=warmup,
            input_buffers=max(buffers.values()),
            clocks=clocks,
            batches=speeds[name],
            kernels=kernels[name],
            weight_bytes={
                EngineName.FP16: engine_weight_bytes(engines[base]),
                EngineName.FP8: engine_weight_bytes(engines[name]),
            },
        )
        for name in names[1:]
    }
