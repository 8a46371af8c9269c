"""`quantstudy bench kernels`: every kernel of one engine call, over fresh compiles (GPU).

The study's breakdown keeps eight kernels per engine; this keeps every one, for the fp16 and one
FP8 engine of a prepared study at one batch, each engine compiled `compiles` times from an empty
Inductor cache, and copies the generated source of the slowest Inductor kernels beside the
record. Two compiles of the same code can pick different kernels (autotuning, cuDNN algorithm
choice): a difference between them is compile noise, not a change in the code, and the copied
source shows layout conversions or poor launch configurations instead of leaving them guessed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from quantstudy.bench.provenance import collect_provenance, need_cuda
from quantstudy.bench.schema import KernelsBench, KernelTime
from quantstudy.engines.builders import build_fp8, build_half, set_numerics
from quantstudy.record import StudyConfig
from quantstudy.record.vocab import Engine
from quantstudy.speed.kernels import group_kernel, kernel_events
from quantstudy.study.prepare import prepare_study


def bench_kernels(
    config: StudyConfig,
    kernel: str,
    batch: int,
    out_dir: Path,
    *,
    compiles: int = 2,
    sources: int = 6,
    argv: list[str] | None = None,
) -> KernelsBench:
    """Profile one call of each engine per fresh compile; write kernel sources into `out_dir`."""
    need_cuda("bench kernels", " (kernel profiles are CUDA profiles)")
    prepared = prepare_study(config)
    set_numerics()
    device, x, example = prepared.device, prepared.heldout_x, prepared.example
    model, fold = prepared.model, prepared.recipe.weights.fold_bn
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, list[KernelTime]]] = []
    written: list[str] = []
    for i in range(compiles):
        cache = Path(tempfile.mkdtemp(prefix=f"inductor-{i}-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # nothing carries over
        torch._dynamo.reset()
        spec = config.replace(fp8_kernel=kernel, batches=(batch,)).build_spec()
        engines = {
            Engine.FP16: build_half(model, device, example, fold=fold),
            Engine.FP8: build_fp8(model, device, example, prepared.plan, fold=fold, spec=spec),
        }
        entry: dict[str, list[KernelTime]] = {}
        for name, engine in engines.items():
            by_name: dict[str, float] = {}
            for k, us in kernel_events(engine, x, batch):
                by_name[k] = by_name.get(k, 0.0) + us
            ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
            entry[name] = [KernelTime(kernel=k, us=us, group=group_kernel(k)) for k, us in ranked]
            for k in [k for k, _ in ranked if k.startswith("triton_")][:sources]:
                source = kernel_source(k, cache)
                if source is not None:
                    path = out_dir / f"compile{i}-{name}-{k}.py"
                    path.write_text(source)
                    written.append(path.name)
            top = ", ".join(f"{k[:40]} {us:.0f}" for k, us in ranked[:5])
            print(f"compile {i} {name}: {sum(by_name.values()):.0f} us; top: {top}", flush=True)
        runs.append(entry)
    return KernelsBench(
        provenance=collect_provenance(device, argv),
        meaningful=True,
        model=config.model,
        recipe=prepared.inputs.recipe_source,
        batch=batch,
        fp8_kernel=kernel,
        compiles=runs,
        sources=written,
    )


def kernel_source(name: str, cache: Path) -> str | None:
    """The generated file that defines kernel `name`, from Inductor's cache."""
    needle = f"def {name}("
    for path in cache.rglob("*.py"):
        text = path.read_text(errors="replace")
        if needle in text:
            return text
    return None
