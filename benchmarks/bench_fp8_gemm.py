"""Each FP8 layer's matrix product alone, every way we can run it: where the fused kernel loses.

The engine benchmarks (runs 4-5) showed the fused FP8 products slower than the fp16 convs they
replace on the projection layers of EfficientNet-Lite0 and MobileNetV4 (FP8_NOTES.md). This script
takes the unique M x K x N products of a model's FP8 layers (its built-in recipe, `fp8_bytes.py`'s
shapes) at one batch and times, on the GPU, with `triton.testing.do_bench_cudagraph`:

- fp16 conv: the 1x1 conv in fp16 on a channels-last input, as cuDNN runs it in the fp16 engine
  (stride-1 convs only; linears: the fp16 matmul);
- fp16 mm: the same product as a cuBLAS fp16 matmul;
- scaled_mm: torch._scaled_mm with row-wise scales (K and N padded to 16), bf16 out;
- the fused Triton kernel (`quant/triton_fp8.py`), with bias, no activation: autotuned as the
  engine runs it (every I/O path: pointers or tensor descriptors, Hopper's copy engine, for the
  loads and for the store) and autotuned on pointers only (the kernel of runs 4-5), each checked
  against torch; unless `--quick`, every tile of TILES on every path the product allows and,
  for thin products, the streaming tiles (STREAM_TILES) that hold all of K and N.

No input quantize in any of them. Each row gets its roofline (bytes at 4.3 TB/s for the fused
kernel: FP8 input and weight, fp16 output) and the achieved fraction. Prints a table, writes JSON.

    python benchmarks/bench_fp8_gemm.py --models tf_efficientnet_lite0 --batch 128 --out f.json
    python benchmarks/bench_fp8_gemm.py --dry-run   # shapes and bytes only (CPU)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_bytes import BW, selected_layers

from quantstudy.quant.modules import real_fp8_blocker
from quantstudy.record.io import write_json_atomic

DEFAULT_MODELS = "tf_efficientnet_lite0,mobilenetv4_conv_large.e500_r256_in1k"


def shapes(model_name: str, batch: int) -> list[dict]:
    """Unique products of the model's real FP8 layers: M, K, N, the conv's map, the layer names."""
    model, chosen, _, _ = selected_layers(model_name)
    out: dict[tuple, dict] = {}
    for name, (h, w) in chosen:
        layer = model.get_submodule(name)
        if real_fp8_blocker(layer) is not None:
            continue
        if isinstance(layer, torch.nn.Conv2d):
            sh, sw = layer.stride
            ho, wo = -(-h // sh), -(-w // sw)
            key = (batch * ho * wo, layer.in_channels, layer.out_channels, (sh, sw) == (1, 1))
            conv_map = [batch, layer.in_channels, ho, wo] if (sh, sw) == (1, 1) else None
        else:
            key = (batch * h * w, layer.in_features, layer.out_features, False)
            conv_map = None
        row = out.setdefault(
            key, {"m": key[0], "k": key[1], "n": key[2], "conv_map": conv_map, "layers": []}
        )
        row["layers"].append(name)
    return list(out.values())


def fused_bytes(m: int, k: int, n: int) -> int:
    return m * k + n * k + 2 * m * n  # FP8 input and weight, fp16 output


def time_us(fn) -> float:
    """Mean time of CUDA-graph replays (triton's do_bench_cudagraph), after one eager call
    so that compilation and cuBLAS/cuDNN heuristics happen outside the capture."""
    from triton.testing import do_bench_cudagraph

    fn()
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=20)) * 1e3


def time_shape(row: dict, quick: bool) -> dict:
    """Every way of running one product; microseconds per call. `quick`: autotuned kernels only."""
    from quantstudy.quant.fused import _act_reference
    from quantstudy.quant.triton_fp8 import PROMOTE, STREAM_TILES, TILES, fp8_gemm_triton, tma_ok

    m, k, n = row["m"], row["k"], row["n"]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a16 = torch.randn(m, k, device=dev, generator=g, dtype=torch.float16)
    w16 = torch.randn(n, k, device=dev, generator=g, dtype=torch.float16) / k**0.5
    a8, w8 = a16.to(torch.float8_e4m3fn), w16.mul(64).to(torch.float8_e4m3fn)
    w_scale = torch.full((n,), 1 / 64, device=dev)
    x_scale = torch.tensor(1.0, device=dev)
    bias = torch.zeros(n, device=dev)
    ref = _act_reference((a8.float() @ w8.float().t()) * (w_scale * x_scale) + bias, "none")
    times: dict[str, float] = {"fp16 mm": time_us(lambda: a16 @ w16.t())}
    if row["conv_map"] is not None:
        b, c, h, w = row["conv_map"]
        x = a16.reshape(b, h, w, c).permute(0, 3, 1, 2)  # channels-last view
        w4 = w16.reshape(n, k, 1, 1).contiguous(memory_format=torch.channels_last)
        times["fp16 conv"] = time_us(lambda: F.conv2d(x, w4))
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    a8p = F.pad(a16, (0, kp - k)).to(torch.float8_e4m3fn)
    w8p = F.pad(w16.mul(64), (0, kp - k, 0, np_ - n)).to(torch.float8_e4m3fn)
    sa = torch.ones(m, 1, device=dev)
    sb = torch.full((1, np_), 1 / 64, device=dev)
    times["scaled_mm"] = time_us(
        lambda: torch._scaled_mm(a8p, w8p.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    )
    # The autotuned launches (what the engine runs, all paths; the same with all of K summed in
    # the tensor cores, the kernel of runs 4-15, to price the float32 promotion every
    # `triton_fp8.PROMOTE` products; and pointers only, the kernel of runs 4-5), then unless
    # `quick` every tile on every path this product allows. The last field: fast accumulation.
    runs: list[tuple[str, tuple | None, str | None, str | None, int, bool]] = [
        ("autotuned", None, None, None, 0, False),
        ("autotuned fast-accum", None, None, None, 0, True),
        ("autotuned pointer", None, "pointer", "pointer", 0, False),
    ]
    if not quick:
        can_load = tma_ok(a8) and tma_ok(w8)
        can_store = n * 2 % 16 == 0
        for loads in ["pointer", "tma"] if can_load else ["pointer"]:
            for store in ["pointer", "tma"] if can_store else ["pointer"]:
                for cfg in TILES:
                    label = f"{loads}/{store} " + "x".join(map(str, cfg))
                    runs.append((label, cfg, loads, store, 0, False))
        for store in ["pointer", "tma"] if can_store else ["pointer"]:
            for *cfg, per_sm in STREAM_TILES:
                bn, bk = cfg[1], cfg[2]
                if n <= bn <= max(16, 2 * n) and k <= bk <= max(32, 2 * k):
                    label = f"stream{per_sm}/{store} " + "x".join(map(str, cfg))
                    runs.append((label, tuple(cfg), "pointer", store, per_sm, False))
    errors: dict[str, float] = {}
    for label, cfg, loads, store, per_sm, fast in runs:

        def call(cfg=cfg, loads=loads, store=store, per_sm=per_sm, fast=fast):
            return fp8_gemm_triton(
                a8, w8, w_scale, x_scale, bias, "none", torch.float16, cfg, loads, store, per_sm,
                promote=0 if fast else PROMOTE,
            )  # fmt: skip

        try:
            if cfg is None:  # the autotuned launch is what the engine runs: check it
                err = (call().float() - ref).abs() / (ref.abs() + 1)
                errors[label] = float(err.max())
            times[label] = time_us(call)
        except Exception as exc:  # a tile the compiler refuses (shared memory): recorded
            times[label] = float("nan")
            row.setdefault("refused", {})[label] = str(exc).splitlines()[0][:200]
    others = ("fp16 mm", "fp16 conv", "scaled_mm", "autotuned fast-accum")  # not what engines run
    triton_times = {key: v for key, v in times.items() if key not in others}
    best = min(triton_times, key=triton_times.get) if triton_times else None
    roof_us = fused_bytes(m, k, n) / BW * 1e6
    return row | {
        "us": times,
        "max_rel_error": errors,
        "best_triton": best,
        "roofline_us": roof_us,
        "best_triton_of_roofline": triton_times[best] / roof_us if best else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true", help="shapes and bytes only, no GPU")
    p.add_argument("--quick", action="store_true", help="autotuned kernels only, no tile sweep")
    args = p.parse_args()
    results = []
    for model_name in args.models.split(","):
        rows = shapes(model_name, args.batch)
        print(f"== {model_name}, batch {args.batch}: {len(rows)} unique products", flush=True)
        for row in rows:
            row["model"] = model_name
            line = f"M {row['m']:>8} K {row['k']:>5} N {row['n']:>5} x{len(row['layers'])}"
            if args.dry_run:
                mb = fused_bytes(row["m"], row["k"], row["n"]) / 1e6
                print(f"{line}  {mb:8.1f} MB  roofline {mb / BW * 1e12:7.1f} us", flush=True)
                results.append(row)
                continue
            t0 = time.perf_counter()
            row = time_shape(row, args.quick)
            us = row["us"]
            best = row["best_triton"]
            auto = {key: v for key, v in us.items() if key.startswith("autotuned")}
            print(
                f"{line}  fp16 conv {us.get('fp16 conv', float('nan')):7.1f}  fp16 mm "
                f"{us['fp16 mm']:7.1f}  scaled_mm {us['scaled_mm']:7.1f}  best triton "
                f"{us.get(best, float('nan')):7.1f} ({best})  "
                + "  ".join(f"{key} {v:7.1f}" for key, v in auto.items())
                + f"  roofline {row['roofline_us']:6.1f} us  [{time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
            results.append(row)
            if args.out:
                write_json_atomic(args.out, {"batch": args.batch, "results": results})
    if args.out and args.dry_run:
        write_json_atomic(args.out, {"batch": args.batch, "results": results})


if __name__ == "__main__":
    main()
