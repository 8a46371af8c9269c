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
from collections.abc import Callable
from pathlib import Path

import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.engines.builders import build_fp8, build_half, set_numerics
from quantstudy.engines.run import run_engine
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quant.apply import QuantPlan
from quantstudy.quant.calibrate import calibrate
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import CompileMode, choices
from quantstudy.speed.harness import measure_speed
from quantstudy.study.environment import collect_environment

# model -> (weights, extra recipe variants to time beside the family default)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mobilenetv4_conv_large.e500_r256_in1k": ("random", ()),
    "ghostnet_100": ("random", ()),
    "xception41": ("random", ()),
    "crossvit_9_240": ("random", ()),
    # generic_pointwise: only the 1x1 convs, which run real FP8; the built-in recipe also takes
    # the 48 3x3 convs, which have no FP8 kernel here and run quantize-dequantized in fp16
    "res2net50_26w_4s": ("random", ("generic_pointwise",)),
    "tf_efficientnet_lite0": ("efficientnet-lite0", ()),
}
# The FP8 engines timed against fp16, side by side: the fused kernel and the unfused one.
KERNELS = ("fused", "scaled_mm")


def gpu_setup(script: str) -> torch.device:
    """What every GPU benchmark does first: stop without CUDA, set the study's numerics."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA GPU")
    set_numerics()
    return torch.device("cuda")


def prepare(name: str, weights: str, recipe_name: str, images_dir: Path, n_images: int):
    """What every GPU benchmark starts from: the model (on the CPU; random-weight models with
    BatchNorm statistics re-estimated on the images so fp16 activations stay finite), the
    first `n_images` images, the recipe, its source and its plan, calibrated on the GPU.
    Returns (loaded, model, images, recipe, source, plan)."""
    loaded = load_model(name, weights)
    pre = resolve_preprocessing(loaded.model)
    items = scan_folder(images_dir).items[:n_images]
    x, _ = load_images(items, build_transform(pre), desc=f"{name}: images")
    recipe, source = load_recipe(recipe_name)
    layers = [d.name for d in resolve(recipe, loaded.model, x[:1]).selected]
    device = torch.device("cuda")
    model = loaded.model.to(device)

    def batches():
        return (x[i : i + 32].to(device) for i in range(0, len(x), 32))

    if loaded.info.random_weights:
        reestimate_batchnorm(model, batches())
    a = recipe.activations
    cal = calibrate(model, layers, batches(), a.calibrator, a.params)
    per_channel = recipe.weights.granularity == "per_channel"
    plan = QuantPlan(layers, per_channel, cal, recipe.weights.bias_correction)
    return loaded, model.cpu(), x, recipe, source, plan


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
    agree_images: torch.Tensor | None = None,
    fp16_autotune_batch: int | None = None,
    save: Callable[[dict], None] = lambda partial: None,
) -> dict:
    """One model's record; `save` gets it after each phase (timings, agreement, max-autotune),
    so a run cut short keeps what it finished."""
    loaded, model, x, recipe, source, plan = prepare(
        name, weights, recipe_name, images_dir, n_images
    )
    example = x[:1]
    device = torch.device("cuda")
    t0 = time.perf_counter()
    fold = recipe.weights.fold_bn
    fp16 = build_half(model, device, example, fold=fold, compile_mode=compile_mode)
    engines = {
        kernel: build_fp8(
            model, device, example, plan, fold=fold, compile_mode=compile_mode, kernel=kernel
        )
        for kernel in KERNELS
    }
    out = {
        "model": name,
        "weights": loaded.info.weights_detail,
        "recipe": source,
        "selected": len(plan.layers),
        "kernels": {},
    }
    for kernel, fp8 in engines.items():
        print(f"  {time.perf_counter() - t0:6.1f} s  timing fp16 vs FP8 {kernel}", flush=True)
        speed = measure_speed(
            fp16, fp8, x, batches, rounds=rounds, iters=iters, compile_mode=compile_mode
        )
        info = fp8.info()
        out["kernels"][kernel] = {
            "fp8_real": len(info.fp8_real),
            "fp8_emulated": len(info.fp8_emulated),
            "epilogue_activations": len(info.fp8_epilogue),
            "fp8_handoffs": len(info.fp8_handoff),
            "scaled_mm_output": info.fp8_scaled_mm_output,
            "speed": speed.model_dump(mode="json"),
        }
    print_table([out])
    save(out)
    if agree_images is not None:
        print(f"  {time.perf_counter() - t0:6.1f} s  fused vs unfused agreement", flush=True)
        out["fused_vs_unfused"] = agreement(engines, agree_images)
        save(out)
    if fp16_autotune_batch is not None:
        print(f"  {time.perf_counter() - t0:6.1f} s  fp16 max-autotune", flush=True)
        out["fp16_max_autotune"] = fp16_autotune(
            model, device, example, fold, x, fp16_autotune_batch, rounds, iters
        )
    out["build_and_time_s"] = time.perf_counter() - t0
    out["complete"] = True
    save(out)
    print_table([out], timings=False)
    return out


def agreement(engines: dict, images: torch.Tensor) -> dict:
    """Top-1 agreement of the fused and unfused FP8 engines on `images` (all of them)."""
    with torch.no_grad():
        top = {k: run_engine(e, images, 128).argmax(1) for k, e in engines.items()}
    same = int((top["fused"] == top["scaled_mm"]).sum())
    return {"n_images": len(images), "same_top1": same, "agreement": same / len(images)}


def fp16_autotune_record(name: str, args: argparse.Namespace) -> dict:
    """The max-autotune check alone for one model: its recipe's BatchNorm folding, real images,
    no FP8 engine (about half of a full run's compile time)."""
    weights, _ = MODELS.get(name, ("random", ()))
    recipe_name = default_recipe_for(name)
    loaded, model, x, recipe, source, _ = prepare(
        name, weights, recipe_name, args.images, args.n_images
    )
    device = torch.device("cuda")
    t0 = time.perf_counter()
    result = fp16_autotune(
        model,
        device,
        x[:1],
        recipe.weights.fold_bn,
        x,
        args.fp16_autotune_batch,
        args.rounds,
        args.iters,
    )
    return {
        "model": name,
        "weights": loaded.info.weights_detail,
        "recipe": source,
        "kernels": {},
        "fp16_max_autotune": result,
        "build_and_time_s": time.perf_counter() - t0,
        "complete": True,
    }


def fp16_autotune(model, device, example, fold, x, batch, rounds, iters) -> dict:
    """The fp16 engine under Inductor's default mode against itself under max-autotune.

    Timed with the study's harness in its fp16/FP8 slots: "fp16_ms" is the default-mode engine,
    "fp8_ms" the max-autotune one, so x > 1 means max-autotune made fp16 faster.
    """
    default = build_half(model, device, example, fold=fold, compile_mode="default")
    tuned = build_half(model, device, example, fold=fold, compile_mode="max-autotune")
    tuned.name = "fp16-max-autotune"
    speed = measure_speed(
        default, tuned, x, [batch], rounds=rounds, iters=iters, compile_mode="max-autotune"
    )
    return {"slots": "fp16_ms = default mode, fp8_ms = max-autotune"} | speed.model_dump(
        mode="json"
    )


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}]"


def _count(k: dict | None) -> str:
    return str(k["kernel_count"]) if k else "-"


def print_table(results: list[dict], timings: bool = True) -> None:
    """The timing rows (`timings`), then the agreement and max-autotune lines where measured."""
    head = (
        "model",
        "FP8 kernel",
        "batch",
        "fp16 ms",
        "FP8 ms",
        "x [q1-q3]",
        "kernels fp16/FP8",
        "FP8 groups us (fp8mm/fp16mm/dw/quant/other)",
    )
    order = ("fp8_matmul", "fp16_matmul_conv", "depthwise_conv", "quantize_convert", "other")
    if timings:
        print(" | ".join(head))
    for r in results:
        for kernel, k in r["kernels"].items() if timings else ():
            speed = k["speed"]
            kernels = {(p["engine"], p["batch"]): p for p in speed["kernels"]}
            for b in speed["batches"]:
                k16, k8 = kernels.get(("fp16", b["batch"])), kernels.get(("fp8", b["batch"]))
                groups = {g["group"]: g["time_us"] for g in k8["groups"]} if k8 else {}
                cells = [
                    r["model"],
                    kernel,
                    str(b["batch"]),
                    f"{b['fp16_ms']['median']:.3f}",
                    f"{b['fp8_ms']['median']:.3f}",
                    _ratio(b["ratio"]),
                    f"{_count(k16)}/{_count(k8)}",
                    "/".join(f"{groups.get(g, 0):.0f}" for g in order),
                ]
                print(" | ".join(cells))
        if "fused_vs_unfused" in r:
            a = r["fused_vs_unfused"]
            print(
                f"{r['model']}: fused vs unfused top-1 agreement {a['agreement']:.4f} "
                f"({a['same_top1']}/{a['n_images']})"
            )
        if "fp16_max_autotune" in r:
            b = r["fp16_max_autotune"]["batches"][0]
            print(
                f"{r['model']}: fp16 default {b['fp16_ms']['median']:.3f} ms, max-autotune "
                f"{b['fp8_ms']['median']:.3f} ms at batch {b['batch']}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, required=True, help="real images (ImageNet folder)")
    p.add_argument("--n-images", type=int, default=128)
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma-separated; MODEL@RECIPE times that recipe alone instead of the model's "
        "built-in recipe and its variants",
    )
    p.add_argument("--batches", default="1,32,128")
    p.add_argument("--compile-mode", default="default", choices=choices(CompileMode))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--agreement",
        action="store_true",
        help="real-weight models: top-1 agreement of fused and unfused FP8 on all --images",
    )
    p.add_argument(
        "--fp16-autotune-batch",
        type=int,
        help="also time the fp16 engine under max-autotune against default mode at this batch",
    )
    p.add_argument(
        "--fp16-autotune-only",
        action="store_true",
        help="time only the fp16 engine, default mode against max-autotune (no FP8 engines)",
    )
    args = p.parse_args()
    if args.fp16_autotune_only and args.fp16_autotune_batch is None:
        raise SystemExit("--fp16-autotune-only needs --fp16-autotune-batch")
    device = gpu_setup("bench_speed.py")
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    env = collect_environment(device).model_dump(mode="json")
    command = vars(args) | {"images": str(args.images), "out": str(args.out)}

    def write(records: list[dict]) -> None:
        write_json_atomic(args.out, {"environment": env, "command": command, "results": records})

    if args.fp16_autotune_only:
        for name in args.models.split(","):
            results.append(fp16_autotune_record(name, args))
            write(results)
            print_table(results[-1:], timings=False)
        return
    for spec in args.models.split(","):
        name, _, only = spec.partition("@")  # MODEL@RECIPE: that recipe alone
        weights, variants = MODELS.get(name, ("random", ()))
        agree = None
        if args.agreement and weights != "random":
            loaded = load_model(name, weights)
            items = scan_folder(args.images).items
            tf = build_transform(resolve_preprocessing(loaded.model))
            agree, _ = load_images(items, tf, desc=f"{name}: agreement images")
        for recipe in (only,) if only else (default_recipe_for(name), *variants):
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
                    agree,
                    args.fp16_autotune_batch,
                    lambda partial: write([*results, partial]),
                )
            )


if __name__ == "__main__":
    main()
