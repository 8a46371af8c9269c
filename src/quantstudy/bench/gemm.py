"""`quantstudy bench gemm`: each FP8 product of a recipe alone, every way it can run.

For the unique M x K x N products of a model's real FP8 layers at one batch (`shapes.py`), timed
on the GPU from CUDA-graph replays (`triton.testing.do_bench_cudagraph`), no input quantize:

- "fp16 conv": the 1x1 conv in fp16 on a channels-last input, as cuDNN runs it in the fp16
  engine (stride-1 convs only); "fp16 mm": the same product as a cuBLAS fp16 matmul;
- "scaled_mm": torch._scaled_mm with row-wise scales (K and N padded to 16), bf16 out;
- "autotuned": the fused Triton kernel (`quant/kernels/gemm.py`) with bias, no activation, as the
  engine runs it, checked against torch; "autotuned fast-accum": the same with the whole K sum
  left in the tensor cores (the price of promoting to float32 every `PROMOTE` products);
  "autotuned pointer": pointer loads and stores only (no tensor descriptors);
- with `--sweep`: every tile of `TILES` on every I/O path the product allows, and the streaming
  tiles for thin products.

Each row carries its roofline: the fused kernel's bytes at `shapes.roofline_bandwidth` (the
copy bandwidth measured on the GPU). Where this finds the fused kernel slow, and why, is in
docs/fp8-kernel.md. On a machine without CUDA, `--shapes-only` lists the products, bytes and
rooflines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from quantstudy.bench.provenance import collect_provenance, need_cuda
from quantstudy.bench.schema import GemmBench, GemmRow, write_unfinished
from quantstudy.bench.shapes import Product, fp8_products, roofline_bandwidth
from quantstudy.record.vocab import Activation

TIMED = (
    "us per call, mean of CUDA-graph replays (triton.testing.do_bench_cudagraph, rep 20 ms) "
    "after one eager call; no input quantize; random N(0,1) operands"
)
# Variants that are not what an FP8 engine runs: left out of the best Triton time.
REFERENCES = ("fp16 mm", "fp16 conv", "scaled_mm", "autotuned fast-accum")


def bench_gemm(
    model: str,
    recipe: str | None,
    batch: int,
    *,
    shapes_only: bool = False,
    sweep: bool = False,
    argv: list[str] | None = None,
    out: Path | None = None,
) -> GemmBench:
    device = torch.device("cpu")
    if not shapes_only:
        device = need_cuda("bench gemm", " (--shapes-only lists the products on any machine)")
    provenance = collect_provenance(device, argv)
    bandwidth = roofline_bandwidth(device)

    def record(rows: list[GemmRow]) -> GemmBench:
        return GemmBench(
            provenance=provenance,
            meaningful=not shapes_only,
            meaningless_reason="shapes and bytes only, nothing timed" if shapes_only else None,
            batch=batch,
            bandwidth=bandwidth,
            timed=TIMED,
            results=rows,
        )

    products = fp8_products(model, recipe, batch)
    rows: list[GemmRow] = []
    for product in products:
        row = _row(model, product, bandwidth)
        if not shapes_only:
            row = row.model_copy(update=time_product(product, sweep))
            best = row.best_triton
            best_us = row.us[best] if best is not None else float("nan")  # every tile refused
            print(
                f"M {product.m:>8} K {product.k:>5} N {product.n:>5}: fp16 mm "
                f"{row.us['fp16 mm']:.1f} us, scaled_mm {row.us['scaled_mm']:.1f} us, best "
                f"Triton {best_us:.1f} us ({best}), roofline {row.roofline_us:.1f} us",
                flush=True,
            )
        rows.append(row)
        write_unfinished(out, record(rows), len(rows), len(products), "products")
    return record(rows)


def _row(model: str, p: Product, bandwidth: float) -> GemmRow:
    return GemmRow(
        model=model,
        m=p.m,
        k=p.k,
        n=p.n,
        conv_map=p.conv_map,
        layers=p.layers,
        fused_bytes=p.fused_bytes,
        roofline_us=p.fused_bytes / bandwidth * 1e6,
    )


def time_us(fn: Callable[[], object]) -> float:
    """Mean time of CUDA-graph replays, after one eager call so that compilation and
    cuBLAS/cuDNN heuristics happen outside the capture."""
    from triton.testing import do_bench_cudagraph

    fn()
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=20)) * 1e3


# (label, tile, loads, store, programs per SM, fast accumulation) of one Triton launch
Variant = tuple[str, tuple[int, ...] | None, str | None, str | None, int, bool]


def launch_variants(a8: torch.Tensor, w8: torch.Tensor, sweep: bool) -> list[Variant]:
    """(label, tile, loads, store, programs per SM, fast accumulation) of every Triton launch."""
    from quantstudy.quant.kernels.gemm import tma_ok
    from quantstudy.quant.kernels.tiles import STREAM_TILES, TILES

    out: list[Variant] = [
        ("autotuned", None, None, None, 0, False),
        ("autotuned fast-accum", None, None, None, 0, True),
        ("autotuned pointer", None, "pointer", "pointer", 0, False),
    ]
    if not sweep:
        return out
    n, k = w8.shape
    loads = ["pointer", "tma"] if tma_ok(a8) and tma_ok(w8) else ["pointer"]
    stores = ["pointer", "tma"] if n * 2 % 16 == 0 else ["pointer"]
    for load in loads:
        for store in stores:
            for cfg in TILES:
                out.append(
                    (f"{load}/{store} " + "x".join(map(str, cfg)), cfg, load, store, 0, False)
                )
    for store in stores:
        for *tile, per_sm in STREAM_TILES:
            bn, bk = tile[1], tile[2]
            if n <= bn <= max(16, 2 * n) and k <= bk <= max(32, 2 * k):
                label = f"stream{per_sm}/{store} " + "x".join(map(str, tile))
                out.append((label, tuple(tile), "pointer", store, per_sm, False))
    return out


def time_product(p: Product, sweep: bool) -> dict[str, Any]:
    """Every way of running one product: the GemmRow fields `us`, `max_rel_error`,
    `best_triton` and `refused` (tiles the compiler refuses for lack of shared memory)."""
    from triton.runtime.errors import OutOfResources

    from quantstudy.quant.kernels.gemm import fp8_gemm_triton
    from quantstudy.quant.layers.fused_matmul import act_reference
    from quantstudy.record.build_spec import PROMOTE

    m, k, n = p.m, p.k, p.n
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a16 = torch.randn(m, k, device=dev, generator=g, dtype=torch.float16)
    w16 = torch.randn(n, k, device=dev, generator=g, dtype=torch.float16) / k**0.5
    a8, w8 = a16.to(torch.float8_e4m3fn), w16.mul(64).to(torch.float8_e4m3fn)
    w_scale = torch.full((n,), 1 / 64, device=dev)
    x_scale = torch.tensor(1.0, device=dev)
    bias = torch.zeros(n, device=dev)
    ref = act_reference((a8.float() @ w8.float().t()) * (w_scale * x_scale) + bias, Activation.NONE)
    us: dict[str, float] = {"fp16 mm": time_us(lambda: a16 @ w16.t())}
    if p.conv_map is not None:
        b, c, h, w = p.conv_map
        x = a16.reshape(b, h, w, c).permute(0, 3, 1, 2)  # channels-last view
        w4 = w16.reshape(n, k, 1, 1).contiguous(memory_format=torch.channels_last)
        us["fp16 conv"] = time_us(lambda: F.conv2d(x, w4))
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    a8p = F.pad(a16, (0, kp - k)).to(torch.float8_e4m3fn)
    w8p = F.pad(w16.mul(64), (0, kp - k, 0, np_ - n)).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(m, 1, device=dev), torch.full((1, np_), 1 / 64, device=dev)
    us["scaled_mm"] = time_us(
        lambda: torch._scaled_mm(a8p, w8p.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    )
    errors: dict[str, float] = {}
    refused: dict[str, str] = {}
    for label, cfg, loads, store, per_sm, fast in launch_variants(a8, w8, sweep):

        def call(
            cfg: tuple[int, ...] | None = cfg, loads: str | None = loads,
            store: str | None = store, per_sm: int = per_sm, fast: bool = fast,
        ) -> torch.Tensor:  # fmt: skip
            return fp8_gemm_triton(
                a8, w8, w_scale, x_scale, bias, Activation.NONE, torch.float16, tile=cfg,
                loads=loads, store=store, stream=per_sm, promote=0 if fast else PROMOTE,
            )  # fmt: skip

        try:
            if cfg is None:  # an autotuned launch is what an engine runs: check it
                errors[label] = float(((call().float() - ref).abs() / (ref.abs() + 1)).max())
            us[label] = time_us(call)
        except OutOfResources as exc:
            us[label] = float("nan")
            refused[label] = str(exc).splitlines()[0][:200]
    triton = {key: v for key, v in us.items() if key not in REFERENCES and v == v}
    best = min(triton, key=lambda label: triton[label]) if triton else None
    return {"us": us, "max_rel_error": errors, "best_triton": best, "refused": refused}
