"""`quantstudy bench products`: every distinct FP8 product of several models, at several batches,
every way it can run, beside cuBLASLt and cuBLAS: the yardstick of every kernel change.

A product is a linear or 1x1 conv as M x K x N (`shapes.fp8_products`) or a kxk conv as its
implicit GEMM (`shapes.kxk_products`), deduplicated across the models and kept per batch. Each is
timed by the kernel timer (`gpu/timer.py`: the mean of CUDA-graph replays, `REP_MS` of calls
each, after one eager call) with random N(0, 1) operands and a bias, fp16 out:

- "fp16 cuBLAS" (a linear's matmul) or "fp16 cuDNN" (a kxk conv, channels-last): the fp16 engine;
- "cuBLASLt" and "cuBLASLt fast-accum": `torch._scaled_mm` with per-tensor scales and the bias,
  K and N padded to 16, promoting to float32 every K tile or never (`use_fast_accum`); for a conv,
  on its implicit GEMM's shape with no im2col: the rate our conv should reach, not a conv;
- "cuBLASLt + Inductor with-gelu", "... fp8-out", "... with-gelu fp8-out" (matmuls): cuBLASLt's
  fp16 product, then the engine's epilogue as one Inductor kernel (`product_columns.py`): what a
  layer of ours that hands off would cost with cuBLASLt's main loop and the activation and the
  next layer's FP8 input moved into a kernel of their own (torchao's layout, with our fusion);
- "ours": the fused Triton kernel autotuned as an engine runs it (summing as the engines do,
  `record/build_spec.py`: fast by default); "ours promote128" (or, where the engines promote,
  "ours fast-accum") the same with the other sums (`product_row.OTHER_SUMS`); "ours fp16-rounds",
  "ours with-gelu", "ours fp8-out" and "ours with-gelu fp8-out" with the engine's epilogues
  part by part (a transformer's fc1 has all: GELU, then the next layer's FP8 input written);
- "ours persistent ..." (matmuls): each tile of `tiles.PERSISTENT_TILES`, fixed; with
  `other_sums`, also with the other sums; left out with `persistent` False;
- with `sweep`: every tile of `tiles.TILES` on every I/O path (`tile_sweep.sweep_launches`).

TFLOP/s is 2MNK over the time; the fraction of peak is against the GPU's dense FP8 rate for FP8
variants and its fp16 rate for fp16 ones (`speed.ideal.PEAKS`). Every one of our variants is
checked against float32 sums of the same FP8 operands (`max_rel_error`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from quantstudy.bench.product_columns import (
    EPILOGUES,
    cublaslt_columns,
    registered_columns,
)
from quantstudy.bench.product_row import (
    CUBLASLT,
    CUBLASLT_FAST,
    FP16_CONV,
    FP16_MM,
    OTHER_SUMS,
    ProductRow,
)
from quantstudy.bench.provenance import collect_provenance, need_cuda
from quantstudy.bench.schema import ProductsBench, read_record, write_record
from quantstudy.bench.shapes import ConvProduct, Product, fp8_products, kxk_products
from quantstudy.gpu.timer import time_us
from quantstudy.record.build_spec import PROMOTE, BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Activation
from quantstudy.study.model_list import ModelEntry

REP_MS = 20  # milliseconds of calls per replayed graph (`gpu/timer.py`)
TIMED = (
    "us per call, mean of CUDA-graph replays (triton.testing.do_bench_cudagraph, rep 20 ms) after "
    "one eager call; random N(0,1) operands, bias, fp16 out; no input quantize"
)


@dataclass(frozen=True)
class Variants:
    """Which of our variants a run times beside the engine's own: every tile on every I/O path
    (`sweep`), the sums the engines do not use (`other_sums`), the persistent tiles (a run
    judging another change may leave them out)."""

    sweep: bool = False
    other_sums: bool = True
    persistent: bool = True


def bench_products(
    rows: Sequence[ModelEntry],
    batches: Sequence[int],
    *,
    sweep: bool = False,
    other_sums: bool = True,
    persistent: bool = True,
    resume: Path | None = None,
    budget_s: float | None = None,
    argv: list[str] | None = None,
    out: Path | None = None,
) -> ProductsBench:
    """Time every distinct product of `rows` (models and their recipes) at `batches`; rows of
    `resume` (an earlier record of the same command) are kept and not timed again. With
    `budget_s`, no product starts after that many seconds: the record is then marked
    unfinished."""
    device = need_cuda("bench products", " (kernel timings need a GPU)")
    from quantstudy.speed.ideal import peaks_for

    provenance = collect_provenance(device, argv)
    peaks = peaks_for(provenance.gpu_name or "")
    todo = _distinct(rows, batches)
    variants = Variants(sweep, other_sums, persistent)
    spec = BuildSpec.made()  # how the engines sum here: the lab switch, else the default
    done = {_key(r): r for r in _resumed(resume)}
    results: list[ProductRow] = []
    start = time.monotonic()

    def record(unfinished: str | None = None) -> ProductsBench:
        return ProductsBench(
            provenance=provenance, meaningful=True, models=[str(r) for r in rows],
            batches=list(batches),
            peak_fp8_tflops=peaks.fp8_tflops if peaks else None,
            peak_fp16_tflops=peaks.fp16_tflops if peaks else None,
            timed=TIMED, results=results, unfinished=unfinished,
        )  # fmt: skip

    for i, row in enumerate(todo):
        if _key(row) in done:
            results.append(done[_key(row)])
            continue
        if budget_s is not None and time.monotonic() - start > budget_s:
            left = f"{len(todo) - i} of {len(todo)} products not timed (budget {budget_s:.0f} s)"
            final = record(left)
            if out is not None:
                write_record(out, final)
            return final
        results.append(_timed(row, variants, spec))
        so_far = record(f"{len(todo) - i - 1} of {len(todo)} products not timed yet")
        print(_line(so_far, results[-1]), flush=True)
        if out is not None:
            write_record(out, so_far)
    return record()


Key = tuple[object, ...]  # what makes a product distinct: kind, batch, M, K, N, conv


def _key(row: ProductRow) -> Key:
    return (row.kind, row.batch, row.m, row.k, row.n, tuple(row.conv or ()))


def _resumed(path: Path | None) -> list[ProductRow]:
    if path is None or not path.exists():
        return []
    old = read_record(path)
    if not isinstance(old, ProductsBench):
        raise UserError(f"{path} is a {old.kind} record, not a products record")
    return old.results


def _distinct(rows: Sequence[ModelEntry], batches: Sequence[int]) -> list[ProductRow]:
    """The untimed rows: each distinct product of the models' recipes at each batch."""
    found: dict[Key, ProductRow] = {}
    for entry in rows:
        model = entry.name
        for batch in batches:
            shapes: list[Product | ConvProduct] = [
                *fp8_products(model, entry.recipe, batch),
                *kxk_products(model, entry.recipe, batch),
            ]
            for p in shapes:
                row = _untimed(p, batch, model)
                kept = found.setdefault(_key(row), row)
                if kept is not row:  # the same product in another model
                    models = kept.models + [model] * (model not in kept.models)
                    update = {"models": models, "layers": kept.layers + row.layers}
                    found[_key(row)] = kept.model_copy(update=update)
    return list(found.values())


def _untimed(p: Product | ConvProduct, batch: int, model: str) -> ProductRow:
    if isinstance(p, ConvProduct):
        m, k, n = p.gemm
        conv = [p.c, p.h, p.w, p.kh, p.kw, p.stride, p.pad]
        return ProductRow(
            kind="conv", batch=batch, m=m, k=k, n=n, conv=conv, models=[model],
            layers=len(p.layers), flop=2.0 * m * k * n,
        )  # fmt: skip
    return ProductRow(
        kind="matmul", batch=batch, m=p.m, k=p.k, n=p.n, models=[model], layers=len(p.layers),
        flop=2.0 * p.m * p.k * p.n,
    )  # fmt: skip


def _timed(row: ProductRow, variants: Variants, spec: BuildSpec) -> ProductRow:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    from quantstudy.quant.kernels.tuning import TUNE_LOG

    calls, ref = _calls(row, variants, spec)  # each call returns a tensor
    us: dict[str, float] = {}
    errors: dict[str, float] = {}
    refused: dict[str, str] = {}
    tiles: dict[str, str] = {}
    for label, call in calls.items():
        try:
            tuned = len(TUNE_LOG)
            if label.startswith("ours") and not any(e[0] in label for e in EPILOGUES):
                y = torch.as_tensor(call()).float().reshape(ref.shape)
                errors[label] = float(((y - ref).abs() / (ref.abs() + 1)).max())
            us[label] = time_us(call, rep=REP_MS, stat="mean", eager=True)
            if label.startswith("ours") and len(TUNE_LOG) > tuned:  # the autotuner chose
                tiles[label] = TUNE_LOG[-1]["tile"]
        except (OutOfResources, CompilationError, RuntimeError, ValueError) as exc:
            # a tile or option this GPU, compiler or shape refuses: recorded as refused, untimed
            refused[label] = str(exc).splitlines()[0][:200]
    plain = (*OTHER_SUMS.values(), *(e[0] for e in EPILOGUES))  # other numerics or epilogues
    ours = {k: t for k, t in us.items() if k.startswith("ours") and not any(p in k for p in plain)}
    best = min(ours, key=ours.__getitem__) if ours else None
    update = {"us": us, "max_rel_error": errors, "refused": refused, "best_ours": best}
    update |= {"tiles": tiles, "ours_promote": spec.promote}
    return row.model_copy(update=update)


def _calls(
    row: ProductRow, variants: Variants, spec: BuildSpec
) -> tuple[dict[str, Callable[[], object]], torch.Tensor]:
    """Every variant of one product as a call, and the float32 reference of our variants;
    "ours" sums as the engines of `spec` do."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton
    from quantstudy.quant.kernels.tiles import PERSISTENT_TILES

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    m, k, n = row.m, row.k, row.n
    engine = spec.promote  # the engines' interval; `other` the other numerics timed beside
    other = PROMOTE if engine == 0 else 0
    w16 = torch.randn(n, k, device=dev, generator=g, dtype=torch.float16) / k**0.5
    w8, w_scale = w16.mul(64).to(torch.float8_e4m3fn), torch.full((n,), 1 / 64, device=dev)
    x_scale, bias = torch.tensor(1.0, device=dev), torch.randn(n, device=dev, generator=g)
    calls: dict[str, Callable[[], object]] = {}
    if row.conv is not None:
        calls, ref = _conv_calls(row, w16, (w_scale, x_scale, bias), engine, g)
        a16 = torch.randn(m, k, device=dev, generator=g, dtype=torch.float16)
    else:
        a16 = torch.randn(m, k, device=dev, generator=g, dtype=torch.float16)
        a8 = a16.to(torch.float8_e4m3fn)
        calls[FP16_MM] = lambda: F.linear(a16, w16, bias.half())

        def ours(**kw: Any) -> Callable[[], object]:
            kw = {"act": Activation.NONE, "out_dtype": torch.float16, "promote": engine, **kw}
            return lambda: fp8_gemm_triton(a8, w8, w_scale, x_scale, bias, **kw)

        calls["ours"] = ours()
        if variants.other_sums:
            calls[f"ours {OTHER_SUMS[other]}"] = ours(promote=other)
        # the engine's epilogues, part by part: rounding where the unfused engine stores, GELU,
        # the next layer's FP8 input (a ViT's fc1 has all three)
        for label, act, fp8_out in EPILOGUES:
            calls[f"ours {label}"] = ours(
                act=act, out_dtype=torch.float8_e4m3fn if fp8_out else torch.float16,
                out_scale=x_scale if fp8_out else None, round_to=torch.float16,
            )  # fmt: skip
        for bm, bn, bk, warps, stages, sub in PERSISTENT_TILES if variants.persistent else ():
            name = f"{bm}x{bn}x{bk} w{warps} s{stages}" + (" sub" if sub else "")
            tile = (bm, bn, bk, warps, stages)
            promotes = (engine, other) if variants.other_sums else (engine,)
            for promote in promotes:
                label = f"ours persistent {name}"
                calls[label + ("" if promote == engine else f" {OTHER_SUMS[other]}")] = ours(
                    tile=tile, loads="tma", store="tma", persistent=True, subtile=sub,
                    promote=promote,
                )  # fmt: skip
        if variants.sweep:
            from quantstudy.bench.tile_sweep import sweep_launches

            for label, cfg, loads, store, per_sm in sweep_launches(a8, w8):
                calls[f"ours {label}"] = ours(tile=cfg, loads=loads, store=store, stream=per_sm)
        ref = (a8.float() @ w8.float().t()) * (w_scale * x_scale) + bias
    calls.update(cublaslt_columns(a16, w16, bias, fast=engine == 0))
    if row.conv is None:
        from quantstudy.quant.backends.base import Product

        calls.update(registered_columns(Product(a8, w8, x_scale, w_scale, bias, torch.float16,
                                         promote=engine)))  # fmt: skip
    return calls, ref


def _conv_calls(
    row: ProductRow,
    w16: torch.Tensor,
    terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    engine: int,
    g: torch.Generator,
) -> tuple[dict[str, Callable[[], object]], torch.Tensor]:
    """A kxk conv product's calls (cuDNN fp16 and ours, summing every `engine` products) and
    the float32 reference of ours, from the weight `w16` (N, K) and `terms` (weight scales,
    input scale, bias)."""
    from quantstudy.quant.kernels.conv import fp8_conv2d_triton, tap_major

    assert row.conv is not None
    w_scale, x_scale, bias = terms
    dev, n = w16.device, row.n
    calls: dict[str, Callable[[], object]] = {}
    c, h, w, kh, kw, s, p = row.conv
    x16 = torch.randn(row.batch, c, h, w, device=dev, generator=g, dtype=torch.float16)
    x16 = x16.contiguous(memory_format=torch.channels_last)
    x8 = x16.to(torch.float8_e4m3fn)
    w4 = w16.reshape(n, kh, kw, c).permute(0, 3, 1, 2)  # (N, C, KH, KW), tap-major storage
    w4_16 = w4.contiguous(memory_format=torch.channels_last)
    w_taps = tap_major(w4.mul(64).to(torch.float8_e4m3fn))
    calls[FP16_CONV] = lambda: F.conv2d(x16, w4_16, bias.half(), s, p)
    calls["ours"] = lambda: fp8_conv2d_triton(
        x8,
        w_taps,
        (kh, kw),
        w_scale,
        x_scale,
        bias,
        Activation.NONE,
        torch.float16,
        (s, s),
        (p, p),
        promote=engine,
    )
    w32 = w_taps.float().reshape(n, kh, kw, c).permute(0, 3, 1, 2)
    with torch.backends.cudnn.flags(allow_tf32=False):  # float32 sums, not TF32's
        ref = F.conv2d(x8.float(), w32, None, s, p)
    ref = ref * w_scale[None, :, None, None] + bias[None, :, None, None]
    return calls, ref


def _line(rec: ProductsBench, r: ProductRow) -> str:
    nan = float("nan")
    fp16 = r.fp16_us or nan
    lt, fast = r.us.get(CUBLASLT, nan), r.us.get(CUBLASLT_FAST, nan)
    best = r.us.get(r.best_ours or "", nan)
    frac = rec.peak_fraction(r, r.best_ours or "")
    return (
        f"{r.kind:6} b{r.batch:<4} M {r.m:>7} K {r.k:>5} N {r.n:>5}: fp16 {fp16:8.1f} us, "
        f"cuBLASLt {lt:8.1f} / fast {fast:8.1f} us, ours {r.us.get('ours', nan):8.1f} us, "
        f"best {best:8.1f} us ({r.best_ours}, {nan if frac is None else frac:.0%} of peak), "
        f"x {r.cublaslt_alike} {r.best_over_cublaslt or nan:.2f}  [{', '.join(r.models)}]"
    )
