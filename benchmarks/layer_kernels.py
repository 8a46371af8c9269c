"""Per layer, which FP8 product is faster in place: the fused Triton layer or the unfused one (GPU).

Since the fused kernel promotes its sums where cuBLASLt does (`triton_fp8.PROMOTE`), both layers
compute the same products, so an engine could take either per layer without changing a number.
Runs 17-21 found ours faster on thin products and cuBLASLt's on large-K ones (FP8_NOTES.md,
"Fifth GPU session"). This times every FP8 layer of a model's recipe both ways with the search's
own per-layer harness (`search.layer_speed.measure_layer_speed`, real input shapes, compiled one
layer at a time, CUDA graphs, ABBA rounds) and prints, per layer, the time each kernel saves
against fp16, and the sum a per-layer choice would save beyond the fused-only engine.

The fused side includes the activation it absorbs (and so does its fp16 side); the unfused side
does not (its activation is left to Inductor, which fuses it into neighbouring kernels in an
engine), so the two savings are each against their own fp16 module.

    python benchmarks/layer_kernels.py --images DIR --model M --batch 128 --out layers.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_speed import MODELS, gpu_setup, prepare

from quantstudy.recipe.builtin import default_recipe_for
from quantstudy.record.io import write_json_atomic
from quantstudy.search.layer_speed import measure_layer_speed
from quantstudy.study.environment import collect_environment

KERNELS = ("fused", "scaled_mm")


def _us(row) -> str:
    """fp16 / FP8 us, and the saving, of one per-layer row."""
    return (
        f"{row.fp16_ms.median * 1e3:.1f} / {row.fp8_ms.median * 1e3:.1f}, {row.saved_ms * 1e3:+.1f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", help="default: the model's built-in recipe")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = gpu_setup("layer_kernels.py")
    weights = MODELS.get(args.model, ("random", ()))[0]
    recipe_name = args.recipe or default_recipe_for(args.model)
    _, model, x, recipe, source, plan = prepare(args.model, weights, recipe_name, args.images, 128)
    sections = {
        kernel: measure_layer_speed(
            model,
            x[:1],
            plan.layers,
            batch=args.batch,
            per_channel=plan.per_channel,
            calibration=plan.calibration,
            fold=recipe.weights.fold_bn,
            rounds=args.rounds,
            kernel=kernel,
        )
        for kernel in KERNELS
    }
    by = {k: {r.layer: r for r in s.layers} for k, s in sections.items()}
    rows = []
    print("layer | kind | input | fused: fp16 / FP8 us, saved | unfused: fp16 / FP8 us, saved")
    for name in plan.layers:
        f, u = by["fused"][name], by["scaled_mm"][name]
        best = "scaled_mm" if u.saved_ms > f.saved_ms else "fused"
        rows.append(
            {"layer": name, "best": best, "extra_saved_ms": max(0.0, u.saved_ms - f.saved_ms)}
        )
        shape = "x".join(map(str, f.input_shape))
        mark = "  <- unfused" if best == "scaled_mm" else ""
        print(f"{name} | {f.kind} | {shape} | {_us(f)} | {_us(u)}{mark}")
    fused_total = sum(r.saved_ms for r in by["fused"].values())
    extra = sum(r["extra_saved_ms"] for r in rows)
    moved = sum(r["best"] == "scaled_mm" for r in rows)
    print(
        f"{args.model} batch {args.batch}: fused layers save {fused_total * 1e3:.0f} us in all; "
        f"taking the unfused layer where it saves more ({moved} of {len(rows)}) would save "
        f"{extra * 1e3:.0f} us more"
    )
    write_json_atomic(
        args.out,
        {
            "environment": collect_environment(device).model_dump(mode="json"),
            "model": args.model,
            "recipe": source,
            "batch": args.batch,
            "layers": {k: s.model_dump(mode="json") for k, s in sections.items()},
            "choice": rows,
            "fused_saved_ms": fused_total,
            "extra_saved_ms": extra,
        },
    )


if __name__ == "__main__":
    main()
