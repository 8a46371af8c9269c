"""Speed part of the study for the five seed families and EfficientNet-Lite0, one table.

For each model: its built-in recipe (plus named variants), activation scales calibrated on real
images, the fp16 and FP8 engines compiled with Inductor, and the study's own harness
(`quantstudy.speed.harness.measure_speed`): CUDA-graph replay, fp16/FP8 rounds interleaved, median
and IQR over rounds, the ratio x = fp16 / FP8 per round pair, kernel count and kernel time per
group from the profiler. Prints one table and writes JSON.

    python benchmarks/bench_speed.py --images DIR --out results.json \
        [--models a,b] [--batches 1,32,128]

The seed families run with random weights (speed only); EfficientNet-Lite0 with its real weights.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.engines.builders import COMPILE_MODES, build_fp8, build_half, set_numerics
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quant.apply import QuantPlan
from quantstudy.quant.calibrate import calibrate
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.speed.harness import measure_speed
from quantstudy.study.environment import collect_environment
from quantstudy.study.io import write_json_atomic

# model -> (weights, extra recipe variants to time beside the family default)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mobilenetv4_conv_large.e500_r256_in1k": ("random", ()),
    "ghostnet_100": ("random", ()),
    "xception41": ("random", ()),
    "crossvit_9_240": ("random", ()),
    "res2net50_26w_4s": ("random", ()),
    "tf_efficientnet_lite0": ("efficientnet-lite0", ()),
}


def bench_model(
    name: str,
    weights: str,
    recipe_name: str,
    images_dir: Path,
    n_images: int,
    batches: list[int],
    compile_mode: str,
    rounds: int,
    iters: int,
) -> dict:
    loaded = load_model(name, weights)
    model = loaded.model
    pre = resolve_preprocessing(model)
    items = scan_folder(images_dir).items[:n_images]
    x, _ = load_images(items, build_transform(pre), desc=f"{name}: images")
    recipe, source = load_recipe(recipe_name)
    example = x[:1]
    res = resolve(recipe, model, example)
    layers = [d.name for d in res.selected]
    device = torch.device("cuda")
    model_dev = model.to(device)
    if loaded.info.random_weights:  # keep random-weight activations finite in fp16
        reestimate_batchnorm(model_dev, (x[i : i + 32].to(device) for i in range(0, len(x), 32)))
    cal = calibrate(
        model_dev,
        layers,
        (x[i : i + 32].to(device) for i in range(0, len(x), 32)),
        recipe.activations.calibrator,
        recipe.activations.params,
    )
    model = model_dev.cpu()
    plan = QuantPlan(layers, recipe.weights.granularity == "per_channel", cal)
    t0 = time.perf_counter()
    fp16 = build_half(
        model, device, example, fold=recipe.weights.fold_bn, compile_mode=compile_mode
    )
    fp8 = build_fp8(
        model, device, example, plan, fold=recipe.weights.fold_bn, compile_mode=compile_mode
    )
    speed = measure_speed(
        fp16,
        fp8,
        x,
        batches,
        rounds=rounds,
        iters=iters,
        compile_mode=compile_mode,
    )
    info = fp8.info()
    return {
        "model": name,
        "weights": loaded.info.weights_detail,
        "recipe": source,
        "selected": len(layers),
        "fp8_real": len(info.fp8_real),
        "fp8_emulated": len(info.fp8_emulated),
        "build_and_time_s": time.perf_counter() - t0,
        "speed": speed.model_dump(mode="json"),
    }


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}]"


def _count(k: dict | None) -> str:
    return str(k["kernel_count"]) if k else "-"


def print_table(results: list[dict]) -> None:
    head = (
        "model",
        "recipe",
        "batch",
        "fp16 ms",
        "FP8 ms",
        "x [q1-q3]",
        "kernels fp16/FP8",
        "FP8 groups us (fp8mm/fp16mm/dw/quant/other)",
    )
    print(" | ".join(head))
    for r in results:
        kernels = {(k["engine"], k["batch"]): k for k in r["speed"]["kernels"]}
        for b in r["speed"]["batches"]:
            k16, k8 = kernels.get(("fp16", b["batch"])), kernels.get(("fp8", b["batch"]))
            groups = {g["group"]: g["time_us"] for g in k8["groups"]} if k8 else {}
            order = (
                "fp8_matmul",
                "fp16_matmul_conv",
                "depthwise_conv",
                "quantize_convert",
                "other",
            )
            print(
                " | ".join(
                    [
                        r["model"],
                        r["recipe"],
                        str(b["batch"]),
                        f"{b['fp16_ms']['median']:.3f}",
                        f"{b['fp8_ms']['median']:.3f}",
                        _ratio(b["ratio"]),
                        f"{_count(k16)}/{_count(k8)}",
                        "/".join(f"{groups.get(g, 0):.0f}" for g in order),
                    ]
                )
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, required=True, help="real images (ImageNet folder)")
    p.add_argument("--n-images", type=int, default=128)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,32,128")
    p.add_argument("--compile-mode", default="default", choices=list(COMPILE_MODES))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_speed.py needs a CUDA GPU")
    set_numerics()
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    env = collect_environment(torch.device("cuda")).model_dump(mode="json")
    for name in args.models.split(","):
        weights, variants = MODELS.get(name, ("random", ()))
        for recipe in (default_recipe_for(name), *variants):
            print(f"== {name} / {recipe}", flush=True)
            results.append(
                bench_model(
                    name,
                    weights,
                    recipe,
                    args.images,
                    args.n_images,
                    batches,
                    args.compile_mode,
                    args.rounds,
                    args.iters,
                )
            )
            write_json_atomic(
                args.out,
                {
                    "environment": env,
                    "command": vars(args) | {"images": str(args.images), "out": str(args.out)},
                    "results": results,
                },
            )
    print_table(results)


if __name__ == "__main__":
    main()
