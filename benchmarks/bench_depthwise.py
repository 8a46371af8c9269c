"""Each depthwise conv of a model alone: cuDNN in fp16 against our Triton kernel, fp16 or FP8.

The unbuilt extension "FP8 storage around the depthwise convolutions" (FP8_NOTES.md) saves
bytes only if a depthwise kernel that reads FP8 runs about as fast as cuDNN's fp16 one on the
same map. This script measures that before any engine uses it: for every depthwise conv of the
model (random weights; shapes from one traced pass, batch set by --batch) it times, with
`triton.testing.do_bench_cudagraph`,

- cudnn fp16: the conv module in fp16 on a channels-last input, as the fp16 engine runs it;
- triton fp16: `quant/triton_dw.py` on the same fp16 input, fp16 out;
- triton fp8 in: FP8 input (per-tensor scale), fp16 out;
- triton fp8 in/out: FP8 input, FP8 output (the next FP8 layer's input);

each Triton variant at its fastest of `TILES`, with its result checked against the fp16 conv.
Each row gets the bytes every variant moves and the cuDNN time at those bytes. Prints a table,
writes JSON.

    python benchmarks/bench_depthwise.py --models tf_efficientnet_lite0 --out dw.json
    python benchmarks/bench_depthwise.py --dry-run   # shapes and bytes only (CPU)
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fp8_gemm import time_us
from fp8_bytes import BW, out_hw
from fused_plan import depthwise_names

from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.record.io import write_json_atomic
from quantstudy.search.layer_speed import layer_input_shapes

DEFAULT_MODELS = "tf_efficientnet_lite0,mobilenetv4_conv_large.e500_r256_in1k"
TILES = [(64, 64, 4), (32, 128, 4), (128, 32, 4), (64, 128, 8), (16, 256, 8), (128, 64, 8)]


def depthwise_layers(model_name: str, batch: int) -> list[dict]:
    """Unique depthwise convs: channels, kernel, stride, input map, padding, the layer names."""
    from quantstudy.quant.triton_dw import same_padding

    model = timm.create_model(model_name, pretrained=False).eval()
    _, height, width = resolve_preprocessing(model).input_size
    names = depthwise_names(model)
    shapes = layer_input_shapes(model, torch.randn(1, 3, height, width), names)
    rows: dict[tuple, dict] = {}
    for name in names:
        conv = model.get_submodule(name)
        _, c, h, w = shapes[name]
        (k, _), (s, s_w) = conv.kernel_size, conv.stride
        same = isinstance(conv.padding, str) or type(conv).__name__ == "Conv2dSame"
        if s != s_w or conv.dilation != (1, 1) or (not same and len(set(conv.padding)) > 1):
            print(f"  skipped {name}: the kernel runs one stride, no dilation", flush=True)
            continue
        ho, wo = out_hw(conv, h, w)
        pt, pl = (same_padding(h, k, s)[1], same_padding(w, k, s)[1]) if same else conv.padding
        key = (c, k, s, h, w)
        row = rows.setdefault(
            key,
            {"c": c, "k": k, "stride": s, "in": [batch, c, h, w], "out": [batch, c, ho, wo],
             "pad": [pt, pl], "layers": [], "module": conv},
        )  # fmt: skip
        row["layers"].append(name)
    return list(rows.values())


def moved_bytes(row: dict, x_bytes: int, y_bytes: int) -> int:
    b, c, h, w = row["in"]
    _, _, ho, wo = row["out"]
    return b * c * h * w * x_bytes + b * c * ho * wo * y_bytes


def time_row(row: dict) -> dict:
    from quantstudy.quant.triton_dw import depthwise_conv

    dev = torch.device("cuda")
    conv = copy.deepcopy(row["module"]).to(dev, torch.float16)
    conv = conv.to(memory_format=torch.channels_last)
    x16 = torch.randn(row["in"], device=dev, dtype=torch.float16)
    x16 = x16.contiguous(memory_format=torch.channels_last)
    x_scale = x16.abs().amax().float() / 448
    x8 = (x16.float() / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    x8 = x8.contiguous(memory_format=torch.channels_last)
    weight = conv.weight.float()
    bias = conv.bias.float() if conv.bias is not None else None
    with torch.no_grad():
        ref = conv(x16).float()
    out_scale = ref.abs().amax() / 448
    hw, pad, s = tuple(row["out"][2:]), tuple(row["pad"]), row["stride"]
    variants = {
        "triton fp16": (x16, None, None, torch.float16),
        "triton fp8 in": (x8, x_scale, None, torch.float16),
        "triton fp8 in/out": (x8, x_scale, out_scale, torch.float8_e4m3fn),
    }
    times = {"cudnn fp16": time_us(lambda: conv(x16))}
    best_tile, errors = {}, {}
    for label, (x, xs, os_, dtype) in variants.items():
        best = float("inf")
        for tile in TILES:

            def call(x=x, xs=xs, os_=os_, dtype=dtype, tile=tile):
                return depthwise_conv(x, weight, bias, s, pad, hw, "none", xs, os_, dtype, tile)

            t = time_us(call)
            if t < best:
                best, best_tile[label] = t, tile
        times[label] = best
        y = call(tile=best_tile[label]).float() * (os_ if os_ is not None else 1.0)
        errors[label] = float(((y - ref).abs() / (ref.abs() + 1)).max())
    nbytes = {
        "cudnn fp16": moved_bytes(row, 2, 2),
        "triton fp16": moved_bytes(row, 2, 2),
        "triton fp8 in": moved_bytes(row, 1, 2),
        "triton fp8 in/out": moved_bytes(row, 1, 1),
    }
    out = {k: v for k, v in row.items() if k != "module"}
    return out | {
        "us": times,
        "bytes": nbytes,
        "roofline_us": {k: v / BW * 1e6 for k, v in nbytes.items()},
        "best_tile": best_tile,
        "max_rel_error": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true", help="shapes and bytes only, no GPU")
    args = p.parse_args()
    results = []
    for model_name in args.models.split(","):
        rows = depthwise_layers(model_name, args.batch)
        print(
            f"== {model_name}, batch {args.batch}: {len(rows)} unique depthwise convs", flush=True
        )
        for row in rows:
            line = (
                f"C {row['c']:>5} k{row['k']} s{row['stride']} in {row['in'][2]}x{row['in'][3]}"
                f" x{len(row['layers'])}"
            )
            if args.dry_run:
                mb = moved_bytes(row, 2, 2) / 1e6
                print(f"{line}  fp16 {mb:8.1f} MB  roofline {mb / BW * 1e12:7.1f} us", flush=True)
                results.append(
                    {"model": model_name} | {k: v for k, v in row.items() if k != "module"}
                )
                continue
            t0 = time.perf_counter()
            r = {"model": model_name} | time_row(row)
            us = r["us"]
            print(
                f"{line}  "
                + "  ".join(f"{k} {v:7.1f}" for k, v in us.items())
                + f"  roofline fp16 {r['roofline_us']['cudnn fp16']:6.1f} us"
                f"  [{time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
            results.append(r)
            if args.out:
                write_json_atomic(args.out, {"batch": args.batch, "results": results})
    if args.out and args.dry_run:
        write_json_atomic(args.out, {"batch": args.batch, "results": results})


if __name__ == "__main__":
    main()
