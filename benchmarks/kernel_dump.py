"""Every kernel of one engine call, and the Triton source of the slowest generated ones (GPU).

Why: the fp16 engine of mobilenetv4_conv_large took 4.757 ms in run 7 and 5.166 ms in run 15
with the same code, the difference in two Inductor pointwise kernels (bias and ReLU after a
convolution, 492 -> 855 and 244 -> 430 us, both far above their byte counts). This records, for
the fp16 and fused FP8 engines of a model at one batch, every kernel with its time (the study's
breakdown keeps 8), each compiled `compiles` times from scratch, and copies the generated source
of the slowest Inductor kernels out of Inductor's cache, so that layout conversions or poor
launch configurations can be read rather than guessed.

    python benchmarks/kernel_dump.py --images DIR --model M --batch 128 --out DIR
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch._inductor.codecache
from bench_speed import gpu_setup, prepare

from quantstudy.engines.builders import build_fp8, build_half
from quantstudy.recipe.builtin import default_recipe_for
from quantstudy.record.io import write_json_atomic
from quantstudy.speed.kernels import group_kernel, kernel_events


def kernel_source(name: str, cache: Path) -> str | None:
    """The generated Python/Triton file that defines kernel `name`, from Inductor's cache."""
    needle = f"def {name}("
    for path in cache.rglob("*.py"):
        text = path.read_text(errors="replace")
        if needle in text:
            return text
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--weights", default="random")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--compiles", type=int, default=2, help="fresh compiles of each engine")
    p.add_argument("--sources", type=int, default=6, help="Inductor kernels to copy per engine")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = gpu_setup("kernel_dump.py")
    recipe_name = default_recipe_for(args.model)
    _, model, x, recipe, _, plan = prepare(
        args.model, args.weights, recipe_name, args.images, args.batch
    )
    fold = recipe.weights.fold_bn
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict = {"model": args.model, "batch": args.batch, "compiles": []}
    for i in range(args.compiles):
        # A fresh Inductor cache per compile: nothing (kernels, autotuning) carries over.
        cache = Path(tempfile.mkdtemp(prefix=f"inductor-{i}-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        torch._dynamo.reset()
        code_cache = getattr(torch._inductor.codecache, "PyCodeCache", None)
        if code_cache is not None and hasattr(code_cache, "cache_clear"):
            code_cache.cache_clear()  # loaded kernels keep their autotuned launch in memory
        engines = {
            "fp16": build_half(model, device, x[:1], fold=fold),
            "fp8": build_fp8(model, device, x[:1], plan, fold=fold),
        }
        entry = {}
        for name, engine in engines.items():
            events = kernel_events(engine, x, args.batch)
            by_name: dict[str, float] = {}
            for kernel, us in events:
                by_name[kernel] = by_name.get(kernel, 0.0) + us
            ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
            entry[name] = [{"kernel": k, "us": us, "group": group_kernel(k)} for k, us in ranked]
            generated = [k for k, _ in ranked if k.startswith("triton_")][: args.sources]
            for k in generated:
                source = kernel_source(k, cache)
                if source is not None:
                    (args.out / f"compile{i}-{name}-{k}.py").write_text(source)
            print(f"compile {i} {name}: {sum(by_name.values()):.0f} us in {len(events)} kernels;"
                  f" top: " + ", ".join(f"{k[:40]} {us:.0f}" for k, us in ranked[:5]))  # fmt: skip
        record["compiles"].append(entry)
        write_json_atomic(args.out / "kernels.json", record)


if __name__ == "__main__":
    main()
