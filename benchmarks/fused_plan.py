"""What the fused FP8 engine does with each model's layers, found on CPU (structure only).

For each model's built-in recipe (random weights: module structure is all that matters) this
runs the same analysis `engines.builders.build_fp8` runs before compiling the fused engine:
BatchNorm folding, the activations each FP8 layer absorbs (`quant/absorb.py`), the FP8 hand-offs
(`quant/handoff.py`), plus the layers whose K is zero-padded to 16 and the thin products that
the streaming programs can take (K <= 64, N <= 256). For the hand-offs it prices, at one batch,
the bytes they remove: the producer's fp16 output write and the consumer's quantize pass (read
fp16, write FP8) become one FP8 write, 4 bytes per element, at `fp8_bytes.BW` (a lower bound on
time, not a measurement). Prints a table, writes JSON.

    .venv/bin/python benchmarks/fused_plan.py --out benchmarks/results/fused_plan.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_bytes import BW, MODELS, price, selected_layers

from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.absorb import absorbable_activations
from quantstudy.quant.apply import real_layers
from quantstudy.quant.fold import fold_batchnorm
from quantstudy.quant.handoff import fp8_handoffs
from quantstudy.study.io import write_json_atomic


def plan(model_name: str, batch: int) -> dict:
    model, chosen, recipe, per_channel = selected_layers(model_name)
    _, height, width = resolve_preprocessing(model).input_size
    example = torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(0))
    fold_batchnorm(model, example)
    maps = dict(chosen)
    real = real_layers(model, list(maps))
    absorbed = absorbable_activations(model, real, example)
    handoff = fp8_handoffs(model, real, example, absorbed)
    shapes = {n: price(n, model.get_submodule(n), maps[n], batch, per_channel) for n in real}
    saved = sum(4 * shapes[p].m * shapes[p].n for p in handoff)
    return {
        "model": model_name,
        "recipe": recipe,
        "batch": batch,
        "real_fp8_layers": len(real),
        "absorbed": {layer: act for layer, (_, act) in absorbed.items()},
        "absorbed_by_activation": dict(Counter(act for _, act in absorbed.values())),
        "handoff": handoff,
        "handoff_bytes_saved": saved,
        "handoff_roofline_us_saved": saved / BW * 1e6,
        "k_padded": [n for n in real if shapes[n].k % 16],
        "thin": [n for n in real if shapes[n].k <= 64 and shapes[n].n <= 256],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(2)
    rows = []
    head = "model | FP8 layers | absorbed | hand-offs | MB saved | us saved (roofline)"
    head += " | K padded | thin"
    print(head)
    for name in args.models.split(","):
        r = plan(name, args.batch)
        rows.append(r)
        acts = ", ".join(f"{a} x{n}" for a, n in sorted(r["absorbed_by_activation"].items()))
        print(
            f"{name} | {r['real_fp8_layers']} | {len(r['absorbed'])} ({acts or 'none'}) | "
            f"{len(r['handoff'])} | {r['handoff_bytes_saved'] / 1e6:.1f} | "
            f"{r['handoff_roofline_us_saved']:.1f} | {len(r['k_padded'])} | {len(r['thin'])}",
            flush=True,
        )
        if args.out:
            write_json_atomic(args.out, {"batch": args.batch, "bandwidth": BW, "models": rows})


if __name__ == "__main__":
    main()
