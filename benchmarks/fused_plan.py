"""What the fused FP8 engine does with each model's layers, found on CPU (structure only).

For each model's built-in recipe (random weights: module structure is all that matters) this
runs the same analysis `engines.builders.build_fp8` runs before compiling the fused engine:
BatchNorm folding, the activations each FP8 layer absorbs (`quant/absorb.py`), the FP8 hand-offs
(`quant/handoff.py`), plus the layers whose K is zero-padded to 16 and the thin products that
the streaming programs can take (K <= 64, N <= 256). For the hand-offs it prices, at one batch,
the bytes they remove: the producer's fp16 output write and the consumer's quantize pass (read
fp16, write FP8) become one FP8 write, 4 bytes per element, at `fp8_bytes.BW` (a lower bound on
time, not a measurement). It also prices a recipe extension not built yet, FP8 storage around
the depthwise convolutions (their arithmetic in fp16 or fp32): an FP8 layer whose output only a
depthwise conv reads would write it in FP8 (2 bytes per element less: one byte written, one
read), and a depthwise conv whose output (after its activation, which its kernel would apply)
only an FP8 layer reads would write that layer's input (4 bytes per element, as a hand-off).
Prints a table, writes JSON.

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
from quantstudy.quant.absorb import absorbable_activations, with_absorbed
from quantstudy.quant.apply import real_layers
from quantstudy.quant.fold import fold_batchnorm
from quantstudy.quant.handoff import fp8_handoffs
from quantstudy.quant.trace import tensor_links
from quantstudy.record.io import write_json_atomic
from quantstudy.search.layer_speed import layer_input_shapes
from quantstudy.search.sensitivity import kind_of


def depthwise_names(model: torch.nn.Module) -> list[str]:
    """The model's depthwise convolutions, as the recipe counts them (`kind_of`)."""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Conv2d) and kind_of(m) == "conv2d.depthwise"
    ]


def depthwise_fp8_io(model, real, absorbed, example, batch) -> dict:
    """Bytes the FP8-storage-around-depthwise extension would remove (see the docstring). Pairs
    come from tensor links alone, without the exactness check of a hand-off: an upper bound."""
    dws = depthwise_names(model)
    if not dws:
        return {"into_depthwise": {}, "out_of_depthwise": {}, "bytes_saved": 0}
    # the depthwise kernel would apply its own bias and activation, as the FP8 layers do
    absorbed = absorbed | absorbable_activations(model, dws, example)
    base = with_absorbed(model, {layer: act for layer, (act, _) in absorbed.items()}).eval()
    links, _ = tensor_links(base, example, [*real, *dws], [*real, *dws])
    feeds = {p: [c for q, c in links if q == p] for p, _ in links}
    shapes = layer_input_shapes(model, example, dws)
    into = {p: c for p, c in links if p in real and c in dws and len(feeds[p]) == 1}
    out = {p: c for p, c in links if p in dws and c in real and len(feeds[p]) == 1}
    saved = 0
    for dw in into.values():  # the depthwise input: M x C elements at this batch
        _, c, h, w = shapes[dw]
        saved += 2 * batch * h * w * c
    for dw in out:
        conv = model.get_submodule(dw)
        _, c, h, w = shapes[dw]
        ho, wo = (-(-h // conv.stride[0]), -(-w // conv.stride[1]))
        saved += 4 * batch * ho * wo * c
    return {"into_depthwise": into, "out_of_depthwise": out, "bytes_saved": saved}


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
    dw = depthwise_fp8_io(model, real, absorbed, example, batch)
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
        "depthwise_fp8_io": dw,
        "depthwise_fp8_io_roofline_us_saved": dw["bytes_saved"] / BW * 1e6,
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
    head += " | K padded | thin | FP8 around depthwise: in/out, MB, us (not built)"
    print(head)
    for name in args.models.split(","):
        r = plan(name, args.batch)
        rows.append(r)
        acts = ", ".join(f"{a} x{n}" for a, n in sorted(r["absorbed_by_activation"].items()))
        print(
            f"{name} | {r['real_fp8_layers']} | {len(r['absorbed'])} ({acts or 'none'}) | "
            f"{len(r['handoff'])} | {r['handoff_bytes_saved'] / 1e6:.1f} | "
            f"{r['handoff_roofline_us_saved']:.1f} | {len(r['k_padded'])} | {len(r['thin'])} | "
            f"{len(r['depthwise_fp8_io']['into_depthwise'])}/"
            f"{len(r['depthwise_fp8_io']['out_of_depthwise'])}, "
            f"{r['depthwise_fp8_io']['bytes_saved'] / 1e6:.0f}, "
            f"{r['depthwise_fp8_io_roofline_us_saved']:.0f}",
            flush=True,
        )
        if args.out:
            write_json_atomic(args.out, {"batch": args.batch, "bandwidth": BW, "models": rows})


if __name__ == "__main__":
    main()
