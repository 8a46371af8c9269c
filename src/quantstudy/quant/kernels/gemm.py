"""The fused FP8 matrix product as a Triton kernel: FP8 operands, float32 accumulation, epilogue.

y[m, n] = act(acc[m, n] * x_scale * w_scale[n] + bias[n]), acc = sum_k xq[m, k] * w8[n, k],
optionally followed by a residual sum and its activation, res_act(y[m, n] + r[m, n])
(`quant/residual.py`), written once in the engine's dtype, or as the next FP8 layer's quantized
input (FP8 hand-off), or both (a residual sum that is also the next FP8 layer's input). An
input in the engine's dtype is quantized in the kernel with dynamic per-row scales (QUANT_A).
cuBLASLt's FP8 kernel (torch._scaled_mm) writes bf16 and needs a row-wise activation scale
tensor of M elements plus a separate pass for the activation; here the per-channel scale,
folded-BatchNorm bias and activation ride in the epilogue, the activation scale is read from
device memory (no host sync, no M-sized tensor), and any K and N work (masked loads; the fused
layer still pads K to 16 so that rows take 16-byte loads, see `quant/fused.py`).

Per product the autotuner picks the tile, whether operands are read and the output written
through pointers or through tensor descriptors (Hopper's bulk copy engine, TMA), and, for thin
products, streaming programs that keep the weight and walk over row tiles. Why each exists, and
what the H200 measured, is in docs/fp8-kernel.md.

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
import triton
import triton.language as tl

from quantstudy.quant.formats import fp8

try:  # Triton 3.3+ (torch 2.7+); older ones keep the pointer paths only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

E4M3_INV = tl.constexpr(fp8.E4M3_INV)  # per-row scales are max |x| times it (`_row_scales`)

# Activation codes of the epilogue; `quant.fused.ACTIVATIONS` maps modules to them.
ACT_CODES = {"none": 0, "relu": 1, "relu6": 2, "silu": 3, "hardswish": 4, "gelu": 5}

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). The first nine won or tied (within 5%) on at least
# one of the 19 products of EfficientNet-Lite0 at batch 128 in a sweep of 27 tiles x 2 load paths
# on the H200 (docs/results/gemm-tf_efficientnet_lite0-sweep.json); the last three keep the
# batch-1 rows (M 49-12544) and the wide linears of vision transformers covered.
TILES = [
    (256, 128, 64, 8, 3),
    (256, 32, 64, 8, 4),
    (256, 64, 32, 8, 3),
    (128, 64, 32, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 128, 4, 4),
    (128, 128, 64, 8, 3),
    (64, 128, 128, 4, 3),
    (64, 64, 128, 4, 4),
    (64, 32, 64, 4, 4),
    (32, 64, 128, 4, 3),
    (128, 256, 64, 8, 3),
]

# Tiles tried per I/O path (TMA loads, TMA store): every tile with pointers; with descriptors
# the tiles that won with them in that sweep (loads) and the store-bound winners (store), so
# that autotuning stays at about 35 configs per product.
_STORE_BOUND = [(256, 64, 32, 8, 3), (128, 64, 32, 4, 4), (256, 32, 64, 8, 4)]
_TMA_LOADS = [(256, 128, 64, 8, 3), (128, 64, 128, 4, 4), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3)]
# Deeper K steps for the wider linears of vision transformers (crossvit's ran 1.37x slower than
# cuBLASLt with the tiles above); not measured alone. A tile whose shared memory does not fit
# is skipped by the autotuner.
_WIDE = [(128, 128, 128, 8, 4), (128, 256, 128, 8, 3)]
PATH_TILES = {
    (False, False): TILES,
    (False, True): [*_STORE_BOUND, (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3)],
    (True, False): [*_TMA_LOADS, *_WIDE],
    (True, True): [*_TMA_LOADS, *_WIDE, (128, 64, 64, 4, 4), (128, 128, 64, 8, 3)],
}

# Streaming programs for thin products (K <= 64, N <= 256): (BLOCK_M, BLOCK_N, BLOCK_K, warps,
# stages, programs per SM). The H200 sweep found the thin-K expansion convs, which only write
# their output, at about half the fp16 conv's write bandwidth with one tile per program
# (docs/fp8-kernel.md); these tiles are offered to the autotuner beside the others, not measured
# alone.
STREAM_TILES = [
    (128, bn, bk, 4 if bn <= 64 else 8, 3, per_sm)
    for bn in (16, 32, 64, 128, 256)
    for bk in (32, 64)
    for per_sm in (2, 4)
]

# How the kernel reads its operands and writes its output: through pointers (any layout), or
# through tensor descriptors (Hopper's copy engine; needs 16-byte aligned rows, see `tma_ok`).
IO_PATHS = ("pointer", "tma")


def _prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem (they only waste the autotuner's time), streaming
    tiles that do not hold the whole of K and N, and the descriptor paths this launch cannot
    take.

    A tile may overhang a dimension up to 64 (K 16-32 products ran fastest with BLOCK_K 64 in the
    H200 sweep); a bound of 32 leaves no tile for N 16 / K 32 (Lite0's first layer), whose
    fallback, a 256x128 tile, took 2.7x the best time."""
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    has = {"TMA_LOADS": named_args["tma_loads_ok"], "TMA_STORE": named_args["tma_store_ok"]}
    promote = {**named_args, **kwargs}.get("PROMOTE", PROMOTE)  # where Triton puts constexprs
    usable = [
        c
        for c in configs
        if all(has[flag] or not c.kwargs[flag] for flag in has)
        and not (promote and c.kwargs["BLOCK_K"] > promote)
    ]

    def fits(c) -> bool:
        bm, bn, bk = (c.kwargs[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        if c.kwargs["STREAM"]:
            return (
                n <= bn <= max(16, triton.next_power_of_2(n))
                and k <= bk <= max(32, triton.next_power_of_2(k))
                and m >= 4 * bm
            )
        return (
            bn <= max(64, triton.next_power_of_2(n))
            and bk <= max(64, triton.next_power_of_2(k))
            and bm <= max(64, triton.next_power_of_2(m))
        )

    keep = [c for c in usable if fits(c)]
    if keep:
        return keep
    tiles = [c for c in usable if not c.kwargs["STREAM"]]
    area = lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"]  # noqa: E731
    return [min(tiles, key=area)]


def _bench(fn, quantiles=None):
    """Time a config as the engines run it: replayed from a CUDA graph. Timed from the host
    (triton's default), a 5-10 us product measures its launch, and descriptor configs, whose
    launch encodes the tensor maps, lose to slower pointer tiles (H200, docs/fp8-kernel.md).
    Each graph holds about `rep` ms of launches, captured from Python one launch at a time: 5 ms
    (about 1000 launches of a 5 us product) keeps a ~30-config search to seconds per product."""
    return triton.testing.do_bench_cudagraph(fn, rep=5, quantiles=quantiles)


# Triton 3.6's interpreter (torch 2.11's Triton) holds every scalar as a 1-element array, which
# `range` cannot take as a bound or step (numpy refuses int() of a 1-d array; Triton 3.8 squeezes
# it). No Triton op yields a 0-d array there, hence the interpreter-only branch of `_count`; its
# result goes straight into `range` (the interpreter turns every assigned value back to a tensor).
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _count(n):
    """A loop bound or step that `range` takes: `n` itself when compiled (the constexpr branch
    is not generated), a Python int of the interpreter's 1-element array when interpreted."""
    if _INTERPRETED:
        return int(n.handle.data.item())
    return n


@triton.jit
def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row-tiles share each weight tile while it is in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def activation(y, ACT: tl.constexpr):
    """The epilogue's activation (`ACT_CODES`), in float32; shared with `quant/triton_dw.py`."""
    if ACT == 1:
        y = tl.maximum(y, 0.0)
    elif ACT == 2:
        y = tl.minimum(tl.maximum(y, 0.0), 6.0)
    elif ACT == 3:
        y = y * tl.sigmoid(y)
    elif ACT == 4:
        y = y * tl.minimum(tl.maximum(y + 3.0, 0.0), 6.0) / 6.0
    elif ACT == 5:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    return y


@triton.jit
def fp8_range(y, out_scale_ptr):
    """`quant.fp8.to_fp8` up to its cast: divide by the scale, saturate at +-448 (E4M3's
    largest value); the caller's store rounds to nearest even. Shared with `quant/triton_dw.py`."""
    y = tl.math.div_rn(y, tl.load(out_scale_ptr))  # `/` is approximate on the GPU
    return tl.minimum(tl.maximum(y, -448.0), 448.0)


# The engine dtype the epilogue rounds through (`_round`): none (float32), fp16, bf16.
ROUND_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _round(y, ROUND: tl.constexpr):
    """y rounded (to nearest even) to the engine's dtype and back to float32."""
    if ROUND == 1:
        y = y.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
    elif ROUND == 2:
        y = y.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    return y


@triton.jit
def _a_tile(a_ptrs, mask, d_ptrs, k_mask, HAS_DIV: tl.constexpr):
    """One tile of an unquantized input (QUANT_A) times the reciprocal of the migration
    divisor (`d_ptrs`, float32), rounded back to the input's dtype (`quant.fp8.quantize_rows`)."""
    a = tl.load(a_ptrs, mask=mask, other=0.0)
    if HAS_DIV:
        d = tl.load(d_ptrs, mask=k_mask, other=1.0)
        a = (a.to(tl.float32) * d[None, :]).to(a.dtype, fp_downcast_rounding="rtne")
    return a


@triton.jit
def _row_amax(a, amax):
    """The running max |a| of each row."""
    return tl.maximum(amax, tl.max(tl.abs(a.to(tl.float32)), axis=1))


@triton.jit
def _row_scales(amax):
    """`quant.fp8.row_scale`: max |row| x float32(1/448), 1 for an all-zero row."""
    rows = amax * E4M3_INV
    return tl.where(rows > 0.0, rows, 1.0)


@triton.jit
def _to_e4m3(a, inv_rows):
    """`quant.fp8.to_fp8_rows` of a tile: times each row's reciprocal scale, saturate at
    +-448, round to nearest even."""
    q = a.to(tl.float32) * inv_rows[:, None]
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    return q.to(tl.float8e4nv, fp_downcast_rounding="rtne")


# Products summed in the tensor cores before the sums move to float32 registers (`_mma`): 128,
# one K tile of cuBLASLt's FP8 kernels (torch._scaled_mm, use_fast_accum=False), so that the
# fused engine rounds where the unfused one does. 0: never (all of K in the tensor cores).
PROMOTE = 128


@triton.jit
def _mma(a, b, acc, part, step, BLOCK_K: tl.constexpr, PROMOTE: tl.constexpr):
    """One K step: `part` += a @ b in the tensor cores, moved into the float32 `acc` after
    every PROMOTE products (K step `step`, from 0); returns (acc, part), the caller adds the
    last `part`.

    Hopper's FP8 tensor cores align each MMA's products and the running sum to the largest
    exponent and keep about 14 bits, and Triton leaves the whole K loop in them on sm90 unless
    told otherwise; cuBLASLt promotes once per K tile. On the H200, with the whole K in the
    tensor cores the kernel wrote torch._scaled_mm's fp16 values for 75.5% of a 4096x256x384
    product's outputs, promoting after every 32-product MMA for 77.0%, and promoting every 128
    products (any BLOCK_K) for all of them at K 96, 256 and 1024 (tests/gpu/test_fused_gpu.py):
    both engines must promote at the same K, hence PROMOTE. Tiles have BLOCK_K <= PROMOTE or
    PROMOTE == 0 (`_prune`). The price: the fused products take 5-20% longer than with
    Triton's default (docs/fp8-kernel.md)."""
    if PROMOTE == 0:
        part = tl.dot(a, b, part)
    elif BLOCK_K == PROMOTE:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=PROMOTE)
    else:
        part = tl.dot(a, b, part)
        if (step + 1) % (PROMOTE // BLOCK_K) == 0:
            acc += part
            part = tl.zeros_like(part)
    return acc, part


@triton.jit
def _channel_terms(
    offs_n, N, w_scale_ptr, x_scale_ptr, bias_ptr, HAS_BIAS: tl.constexpr, ROW_SCALE: tl.constexpr
):  # fmt: skip
    """Per-output-channel scale (weight scale x activation scale; with ROW_SCALE the activation
    scales are per row, applied in `_finish`) and bias, float32."""
    n_mask = offs_n < N
    scale = tl.load(w_scale_ptr + offs_n, mask=n_mask, other=0.0)
    if not ROW_SCALE:
        scale = scale * tl.load(x_scale_ptr)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    else:
        bias = tl.zeros_like(scale)
    return scale, bias


@triton.jit
def _finish(
    acc, scale, bias, first_m, first_n, M, N, c_ptr, c_desc, stride_cm, stride_cn, out_scale_ptr,
    ACT: tl.constexpr, TMA_STORE: tl.constexpr, OUT_FP8: tl.constexpr, ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, x_rows, ROW_SCALE: tl.constexpr,
    res_ptr, stride_rm, stride_rn, HAS_RES: tl.constexpr, RES_ACT: tl.constexpr,
    q_ptr, PAIR: tl.constexpr, out_w, out_hw, stride_cb, stride_ch, MAP_OUT: tl.constexpr,
):  # fmt: skip
    """Epilogue: scales and bias on the float32 sums, the activation, then one write of the
    tile whose first row and column are `first_m`, `first_n`; with OUT_FP8, the write is the
    next FP8 layer's quantized input (divide by its scale, saturate at 448, round to nearest
    even: `quant.fp8.to_fp8`'s arithmetic). With HAS_RES the residual tile (engine dtype, any
    strides) is added to the activated value and RES_ACT applied to the sum. With PAIR the
    tile is also written to `q_ptr` (same strides) as the next FP8 layer's input, quantized
    from the value stored in the engine's dtype with the scale at `out_scale_ptr`. The values are
    rounded to the engine's dtype (ROUND) wherever the unfused engine stores them (before the
    activation, both terms of the residual sum and the sum itself, before the FP8 write), so
    fused and unfused engines quantize the same numbers. With ROW_SCALE `x_rows` holds the
    tile's rows' activation scales. With MAP_OUT row m is pixel (b, h, w) of a map `out_w` wide
    and `out_hw` pixels per image, written at b * stride_cb + h * stride_ch + w * stride_cm: the
    interior of a zero-padded buffer (`quant/pad_handoff.py`)."""
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if ROW_SCALE:  # dynamic per-row activation scales: x_scale[m] * w_scale[n], as torch does
        y = acc * (scale[None, :] * x_rows[:, None]) + bias[None, :]
    else:
        y = acc * scale[None, :] + bias[None, :]
    y = activation(_round(y, ROUND), ACT)
    if HAS_RES:
        r_ptrs = res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = activation(_round(_round(y, ROUND) + r, ROUND), RES_ACT)
    if OUT_FP8:
        y = fp8_range(_round(y, ROUND), out_scale_ptr)
    if PAIR:
        q = fp8_range(_round(y, ROUND), out_scale_ptr)
        q_ptrs = q_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(q_ptrs, q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    if TMA_STORE:  # one bulk copy per tile; rows and columns past the edge are not written
        c_desc.store([first_m, first_n], y.to(c_desc.dtype, fp_downcast_rounding="rtne"))
    else:
        if MAP_OUT:
            pixel = offs_m % out_hw
            rows = (offs_m // out_hw) * stride_cb + (pixel // out_w) * stride_ch
            rows += (pixel % out_w) * stride_cm
        else:
            rows = offs_m * stride_cm
        c_ptrs = c_ptr + rows[:, None] + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    """The rows' activation scales as given (ROW_SCALE), else zeros (unused)."""
    if ROW_SCALE:
        return tl.load(x_scale_ptr + offs_m, mask=offs_m < M, other=0.0)
    return tl.zeros((BLOCK_M,), dtype=tl.float32)


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, a_desc, b_ptr, b_desc, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
    res_ptr, q_ptr, d_ptr, M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn, stride_rm, stride_rn,
    out_w, out_hw, stride_cb, stride_ch,  # MAP_OUT: the output's pixel map (`_finish`)
    tma_loads_ok, tma_store_ok,  # 0 or 1: the paths this launch allows (autotuner key, prune)
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_LOADS: tl.constexpr, TMA_STORE: tl.constexpr,
    OUT_FP8: tl.constexpr, ROUND: tl.constexpr, PROMOTE: tl.constexpr, ROW_SCALE: tl.constexpr,
    HAS_RES: tl.constexpr, RES_ACT: tl.constexpr, PAIR: tl.constexpr,
    QUANT_A: tl.constexpr, HAS_DIV: tl.constexpr,  # input quantized per row here (prologue)
    MAP_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STREAM: tl.constexpr, PER_SM: tl.constexpr,  # PER_SM: programs per SM (grid), STREAM only
):  # fmt: skip
    # QUANT_A: `a` is the unquantized input in the engine's dtype (pointer loads only); each
    # row's scale is its max |x| x float32(1/448) (a first pass over K), its tiles quantized in
    # registers in the main loop (a second pass, from L2 where K spans several tiles), and the
    # epilogue applies the row scales: dynamic per-row FP8 without a quantize pass.
    if STREAM:
        # Thin products (K <= BLOCK_K, N <= BLOCK_N, see `_prune`): each program keeps the whole
        # weight, its scales and bias in registers and walks over row tiles, so the loads of the
        # next tile are in flight (software-pipelined loop) while this one is finished and stored.
        offs_n = tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
        b = tl.load(b_ptrs, mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
        scale, bias = _channel_terms(
            offs_n, N, w_scale_ptr, x_scale_ptr, bias_ptr, HAS_BIAS, ROW_SCALE
        )
        first, tiles, step = tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)
        for tile in tl.range(_count(first), _count(tiles), _count(step)):
            offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
            a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
            if QUANT_A:
                a = _a_tile(a_ptrs, a_mask, d_ptr + offs_k, offs_k < K, HAS_DIV)
                x_rows = _row_scales(_row_amax(a, tl.zeros((BLOCK_M,), dtype=tl.float32)))
                a = _to_e4m3(a, tl.math.div_rn(1.0, x_rows))
            else:
                a = tl.load(a_ptrs, mask=a_mask, other=0.0)
                x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc, part = _mma(a, b, acc, tl.zeros_like(acc), 0, BLOCK_K, PROMOTE)
            acc += part
            _finish(
                acc, scale, bias, tile * BLOCK_M, 0, M, N, c_ptr, c_desc, stride_cm, stride_cn,
                out_scale_ptr, ACT, TMA_STORE, OUT_FP8, ROUND, BLOCK_M, BLOCK_N,
                x_rows, ROW_SCALE, res_ptr, stride_rm, stride_rn, HAS_RES, RES_ACT,
                q_ptr, PAIR, out_w, out_hw, stride_cb, stride_ch, MAP_OUT,
            )  # fmt: skip
    else:
        pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA_LOADS:
            # No address arithmetic or masks in the loop: tiles past an edge arrive
            # zero-filled, so they add nothing to the sums.
            x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
            for k0 in range(0, _count(tl.cdiv(K, BLOCK_K))):
                a = a_desc.load([pid_m * BLOCK_M, k0 * BLOCK_K])
                b = b_desc.load([pid_n * BLOCK_N, k0 * BLOCK_K])
                acc, part = _mma(a, b.T, acc, part, k0, BLOCK_K, PROMOTE)
        else:
            offs_k = tl.arange(0, BLOCK_K)
            a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
            if QUANT_A:
                amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for k0 in range(0, _count(tl.cdiv(K, BLOCK_K))):
                    k_mask = offs_k < K - k0 * BLOCK_K
                    a_mask = (offs_m[:, None] < M) & k_mask[None, :]
                    ptrs = a_ptrs + k0 * BLOCK_K * stride_ak
                    d_ptrs = d_ptr + k0 * BLOCK_K + offs_k
                    amax = _row_amax(_a_tile(ptrs, a_mask, d_ptrs, k_mask, HAS_DIV), amax)
                x_rows = _row_scales(amax)
                inv_rows = tl.math.div_rn(1.0, x_rows)  # torch.reciprocal: IEEE, once per row
            else:
                x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
            for k0 in range(0, _count(tl.cdiv(K, BLOCK_K))):
                k_left = K - k0 * BLOCK_K
                a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < k_left)
                b_mask = (offs_n[None, :] < N) & (offs_k[:, None] < k_left)
                if QUANT_A:
                    d_ptrs = d_ptr + k0 * BLOCK_K + offs_k
                    a = _a_tile(a_ptrs, a_mask, d_ptrs, offs_k < k_left, HAS_DIV)
                    a = _to_e4m3(a, inv_rows)
                else:
                    a = tl.load(a_ptrs, mask=a_mask, other=0.0)
                b = tl.load(b_ptrs, mask=b_mask, other=0.0)
                acc, part = _mma(a, b, acc, part, k0, BLOCK_K, PROMOTE)
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
        acc += part
        scale, bias = _channel_terms(
            offs_n, N, w_scale_ptr, x_scale_ptr, bias_ptr, HAS_BIAS, ROW_SCALE
        )
        _finish(
            acc, scale, bias, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, c_ptr, c_desc,
            stride_cm, stride_cn, out_scale_ptr, ACT, TMA_STORE, OUT_FP8, ROUND, BLOCK_M, BLOCK_N,
            x_rows, ROW_SCALE, res_ptr, stride_rm, stride_rn, HAS_RES, RES_ACT, q_ptr, PAIR,
            out_w, out_hw, stride_cb, stride_ch, MAP_OUT,
        )  # fmt: skip


def _set_block_shapes(nargs) -> None:
    """Give the descriptors the tile of the config about to run (a descriptor carries it)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    for name, shape in (("a_desc", [bm, bk]), ("b_desc", [bn, bk]), ("c_desc", [bm, bn])):
        if nargs[name] is not None:
            nargs[name].block_shape = shape


# The autotuned kernel (CUDA) over `PATH_TILES`, pointer paths first (they always apply). The
# plain kernel stays callable with one fixed tile, which is how the CPU tests run it under
# TRITON_INTERPRET=1 (the autotuner needs a GPU to time configs).
def _config(bm, bn, bk, warps, stages, loads=False, store=False, per_sm=0):
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "TMA_LOADS": loads, "TMA_STORE": store}
    meta |= {"STREAM": per_sm > 0, "PER_SM": per_sm}
    return triton.Config(meta, num_warps=warps, num_stages=stages, pre_hook=_set_block_shapes)


# What the autotuner keys its choice on (ROW_SCALE: dynamic per-row activation scales;
# HAS_RES: a residual sum in the epilogue; MAP_OUT: a padded buffer's interior written).
AUTOTUNE_KEY = ["M", "N", "K", "ACT", "HAS_BIAS", "OUT_FP8", "PROMOTE", "ROW_SCALE"]
AUTOTUNE_KEY += ["HAS_RES", "RES_ACT", "PAIR", "QUANT_A", "HAS_DIV", "MAP_OUT"]
AUTOTUNE_KEY += ["tma_loads_ok", "tma_store_ok"]
_fp8_gemm_tuned = triton.autotune(
    configs=[
        *(_config(*t, loads, store) for (loads, store), tiles in PATH_TILES.items() for t in tiles),
        *(_config(*t[:5], False, store, t[5]) for store in (False, True) for t in STREAM_TILES),
    ],
    key=AUTOTUNE_KEY,
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_bench,
)(_fp8_gemm_kernel)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: any count exercises the loop over tiles
    return torch.cuda.get_device_properties(device).multi_processor_count


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D operand can go through a tensor descriptor: a Hopper or newer GPU (or the
    interpreter) and a Triton that has them, unit last stride, 16-byte aligned base and row
    stride."""
    if TensorDescriptor is None:
        return False
    if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
        return False
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return (
        t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def fp8_gemm_triton(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    tile: tuple[int, ...] | None = None,
    loads: str | None = None,
    store: str | None = None,
    stream: int = 0,
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    promote: int = PROMOTE,
    residual: torch.Tensor | None = None,
    res_act: str = "none",
    pair: torch.Tensor | None = None,
    x_inv_divisor: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the kernel: xq (M, K) and w8 (N, K) in FP8 E4M3, w_scale (N,) and bias (N,)
    float32, x_scale a float32 scalar tensor or one scale per row ((M, 1), contiguous: dynamic
    per-row activation scales); returns (M, N) in `out_dtype`. An `xq` in another dtype (the
    engine's) is quantized in the kernel with dynamic per-row scales (`quant.fp8.quantize_rows`
    arithmetic; `x_scale` is then not read), after the product with `x_inv_divisor` ((K,)
    float32) where given; w8 may then be wider than K (its padding is not read).

    By default the autotuner picks the tile, the streaming programs for thin products and,
    where `tma_ok` allows, the I/O paths; `loads` or `store` "pointer" keeps it off the
    descriptor path for that side. `tile` (BLOCK_M, BLOCK_N, BLOCK_K[, warps, stages]) fixes the
    tile, with pointers unless "tma" is asked, and `stream` > 0 runs it as that many streaming
    programs per SM (the tile must hold all of K and N). `out_scale` (a float32 scalar tensor)
    writes the output quantized to FP8 with that scale (`out_dtype` must then be E4M3).
    `round_to` (the engine's dtype; None: float32) is where the epilogue rounds (`_finish`);
    `promote` is how many products the tensor cores sum before float32 takes over (`_mma`;
    0: all of K); where K is larger, a multiple of the tile's BLOCK_K. `residual` ((M, N), any
    strides) is added after the activation and `res_act` applied to the sum (`_finish`).
    `pair` ((M, N) FP8, contiguous) also receives the output quantized with `out_scale`, while
    the output itself stays in `out_dtype`. `out` (B, H, W, N) in `out_dtype`, B x H x W = M,
    any strides (the interior of a zero-padded buffer, `quant/pad_handoff.py`) receives the
    output pixel by pixel instead of a new (M, N) tensor, through pointer stores."""
    if promote < 0 or (promote and promote & (promote - 1)):
        raise ValueError(f"promote must be 0 or a power of two, got {promote}")
    if (out_scale is not None) != (out_dtype == torch.float8_e4m3fn or pair is not None):
        raise ValueError("an FP8 output needs out_scale, and out_scale needs an FP8 output")
    if pair is not None and out_dtype == torch.float8_e4m3fn:
        raise ValueError("a pair writes the output in the engine's dtype and its FP8 copy")
    for path in (loads, store):
        if path is not None and path not in IO_PATHS:
            raise ValueError(f"I/O path must be one of {IO_PATHS}, got {path!r}")
    quant_a = xq.dtype != torch.float8_e4m3fn
    if x_inv_divisor is not None and not quant_a:
        raise ValueError("a divisor divides an unquantized input; this one is FP8 already")
    m, k = xq.shape
    n = w8.shape[0]
    if quant_a and (w8.shape[1] < k or xq.stride(1) != 1):
        raise ValueError(f"an input quantized here needs unit column stride and K <= {w8.shape[1]}")
    if residual is not None and tuple(residual.shape) != (m, n):
        raise ValueError(f"the residual must be ({m}, {n}), got {tuple(residual.shape)}")
    mapped = out is not None
    if mapped:
        if out.dim() != 4 or out.shape[0] * out.shape[1] * out.shape[2] != m or out.shape[3] != n:
            raise ValueError(f"a mapped output is (B, H, W, {n}) with B x H x W = {m} rows")
        if out.dtype != out_dtype or pair is not None:
            raise ValueError(f"a mapped output is one {out_dtype} tensor, without an FP8 copy")
    else:
        out = torch.empty((m, n), device=xq.device, dtype=out_dtype)
    if pair is not None and (tuple(pair.shape) != (m, n) or pair.stride() != out.stride()):
        raise ValueError(f"the FP8 copy must be a contiguous ({m}, {n}) tensor")
    if m == 0:
        return out
    default = "pointer" if tile is not None else "tma"
    use_loads = (loads or default) == "tma" and tma_ok(xq) and tma_ok(w8) and not quant_a
    use_store = (store or default) == "tma" and not mapped and tma_ok(out)
    if (loads == "tma" and not use_loads) or (store == "tma" and not use_store):
        raise ValueError("tensor descriptors need 16-byte aligned rows on a Hopper GPU")

    # Placeholder block shapes; the autotuner's pre-hook (or the fixed tile) sets the real ones.
    def desc(t, on):
        return TensorDescriptor.from_tensor(t, [16, 16]) if on else None

    descs = {
        "a_desc": desc(xq, use_loads),
        "b_desc": desc(w8, use_loads),
        "c_desc": desc(out, use_store),
    }
    args = (
        xq, descs["a_desc"], w8, descs["b_desc"], out, descs["c_desc"],
        w_scale, x_scale, bias if bias is not None else w_scale,
        out_scale if out_scale is not None else x_scale,
        residual if residual is not None else out,
        pair if pair is not None else out,
        x_inv_divisor if x_inv_divisor is not None else w_scale,
        m, n, k,
        xq.stride(0), xq.stride(1), w8.stride(0), w8.stride(1),
        *((out.stride(2), out.stride(3)) if mapped else out.stride()),
        *(residual.stride() if residual is not None else (0, 0)),
        *((out.shape[2], out.shape[1] * out.shape[2], out.stride(0), out.stride(1)) if mapped
          else (1, 1, 0, 0)),
        int(use_loads), int(use_store),
    )  # fmt: skip
    meta = {"ACT": ACT_CODES[act], "HAS_BIAS": bias is not None, "GROUP_M": 8}
    meta |= {"ROW_SCALE": quant_a or x_scale.numel() > 1}
    meta |= {"QUANT_A": quant_a, "HAS_DIV": x_inv_divisor is not None}
    meta |= {"HAS_RES": residual is not None, "RES_ACT": ACT_CODES[res_act]}
    meta |= {"PAIR": pair is not None, "MAP_OUT": mapped}
    meta |= {"OUT_FP8": out_scale is not None and pair is None}
    meta |= {"ROUND": ROUND_CODES[round_to or torch.float32]}
    # K within one promotion: the whole sum is one tensor-core chain from zero whatever the tile
    # (the same bits), so the K loop needs no hand-over and every tile depth stays open.
    promote = 0 if k <= promote else promote
    meta |= {"PROMOTE": promote}

    def grid(meta):
        tiles_m = triton.cdiv(m, meta["BLOCK_M"])
        if meta["STREAM"]:
            return (min(tiles_m, _sm_count(xq.device) * meta["PER_SM"]),)
        return (tiles_m * triton.cdiv(n, meta["BLOCK_N"]),)

    if tile is None:
        tensors = (xq, w8, out, *(t for t in (residual, pair) if t is not None))
        _tuned_launch(grid, args, descs, meta, tensors)
        return out
    bm, bn, bk, *launch = tile
    if promote and bk > promote:
        raise ValueError(f"BLOCK_K {bk} is more than the {promote} products per promotion")
    if stream and (k > bk or n > bn or use_loads):
        raise ValueError(
            f"a streaming tile holds all of K and N and loads through pointers: {tile}"
        )
    meta |= {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STREAM": stream > 0, "PER_SM": stream}
    meta |= {"TMA_LOADS": use_loads, "TMA_STORE": use_store}
    if launch:
        meta |= {"num_warps": launch[0], "num_stages": launch[1]}
    _set_block_shapes({**descs, **meta})
    _fp8_gemm_kernel[grid](*args, **meta)
    return out


# --- What the autotuner costs, and how a study avoids paying it twice -----------------------
#
# Each distinct launch (M, N, K, epilogue, I/O paths) is autotuned once per process: every
# pruned config is compiled (serially, by Triton) and timed from a CUDA graph. An engine sees
# one M per layer shape and batch size, so a study's FP8 engine tunes each layer shape at each
# of its batches, and Triton's own disk cache of tuning results refuses configs with a pre-hook
# (ours sets the descriptors' block shapes). Three things keep that to what the study needs:
#
# 1. The choice is stored per GPU, Triton version and kernel source in a JSON file beside the
#    Inductor cache (`tuning_cache_path`): a later process launches the stored config directly.
# 2. On a miss the pruned configs are compiled in parallel threads first (Triton's
#    `AsyncCompileMode`, where the installed Triton has it), then timed as before.
# 3. Within `untimed_tiles()` a launch that was never tuned takes the first pruned config
#    without timing: for the quality passes, whose outputs do not depend on the tile (every
#    tile and path promotes the sums at the same K, `_mma`), so only the timed batches tune.
#
# `TUNE_LOG` lists each launch the autotuner timed in this process, also appended as JSON lines
# to `$QUANTSTUDY_TUNE_LOG` where set (`bench/study_time.py`).

TUNE_LOG: list[dict] = []
_UNTIMED: list[bool] = [False]
_STORED: dict[str, dict] | None = None


@contextmanager
def untimed_tiles() -> Iterator[None]:
    """Within the block, launches not tuned yet run the first pruned config, untimed (their
    results are the same bits whatever the tile; only the time differs)."""
    _UNTIMED.append(True)
    try:
        yield
    finally:
        _UNTIMED.pop()


def tuning_cache_path() -> Path:
    """Beside Inductor's cache (`engines/builders.py` sets its directory), as the per-layer
    kernel choice is."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    base = Path(root).parent if root else Path.home() / ".cache" / "quantstudy"
    return base / "fp8_gemm_tuning.json"


@functools.cache
def _space_id(device_index: int) -> str:
    """GPU, Triton and the kernel's source and config list: a stored choice is valid only
    under all four."""
    import hashlib

    fn = _fp8_gemm_kernel
    configs = "|".join(str(c) for c in _fp8_gemm_tuned.configs)
    blob = f"{fn.cache_key}|{configs}".encode()
    gpu = torch.cuda.get_device_name(device_index)
    return f"{gpu}|triton {triton.__version__}|{hashlib.sha256(blob).hexdigest()[:16]}"


def _stored() -> dict[str, dict]:
    global _STORED
    if _STORED is None:
        path = tuning_cache_path()
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):  # a damaged cache is a cold one
            data = {}
        _STORED = data if isinstance(data, dict) else {}
    return _STORED


def _store(key: str, config_index: int) -> None:
    from quantstudy.record.io import write_json_atomic

    stored = _stored()
    stored[key] = {"config": config_index}
    path = tuning_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        on_disk = json.loads(path.read_text()) if path.is_file() else {}
        merged = {**(on_disk if isinstance(on_disk, dict) else {}), **stored}
        write_json_atomic(path, merged)
    except (OSError, ValueError):
        pass  # not stored: the next process tunes again


def _launch_key(args: tuple, meta: dict, tensors: tuple) -> str:
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    values = [named.get(k, meta.get(k)) for k in AUTOTUNE_KEY]
    values += [meta["ROUND"], *(str(t.dtype) for t in tensors)]
    values += [t.stride(0) % 16 == 0 for t in tensors]
    return json.dumps([_space_id(tensors[0].device.index or 0), values])


def _with_block_shapes(descs: dict, config) -> dict:
    """Descriptors (copies) carrying `config`'s tile, as its pre-hook would set them."""
    own = {name: copy.copy(d) if d is not None else None for name, d in descs.items()}
    _set_block_shapes({**own, **config.kwargs})
    return own


def _args_with(args: tuple, descs: dict) -> tuple:
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    named.update({k: v for k, v in descs.items() if k in named})
    return tuple(named[n] for n in _fp8_gemm_tuned.arg_names[: len(args)])


def _precompile(grid, args: tuple, descs: dict, meta: dict, configs: list) -> None:
    """Compile `configs` for this launch in parallel threads, where Triton can
    (`AsyncCompileMode`); the autotuner then finds them compiled."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # older Triton: the autotuner compiles them one by one
        return
    workers = int(os.environ.get("QUANTSTUDY_TRITON_COMPILE_THREADS", os.cpu_count() or 1))
    if workers < 2 or len(configs) < 2:
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(configs))) as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:
                own = _args_with(args, _with_block_shapes(descs, config))
                _fp8_gemm_kernel.warmup(*own, grid=(1,), **meta, **config.all_kwargs())


def _tuned_launch(grid, args: tuple, descs: dict, meta: dict, tensors: tuple) -> None:
    """Launch the autotuned kernel: the stored choice where there is one (module comment),
    else tune (compiling the configs in parallel first) and store the choice."""
    key = _launch_key(args, meta, tensors)
    entry = _stored().get(key)
    configs = _fp8_gemm_tuned.configs
    index = entry.get("config") if isinstance(entry, dict) else None
    if not (isinstance(index, int) and 0 <= index < len(configs)) and _UNTIMED[-1]:
        named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
        pruned = _prune(configs, named, **meta)
        index = configs.index(pruned[0])
        entry = None  # not stored: a timed launch of this shape still tunes
    if isinstance(index, int) and 0 <= index < len(configs):
        config = configs[index]
        own = _args_with(args, _with_block_shapes(descs, config))
        _fp8_gemm_kernel[grid](*own, **meta, **config.all_kwargs())
        return
    start = time.perf_counter()
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    pruned = _prune(configs, named, **meta)
    _precompile(grid, args, descs, meta, pruned)
    compiled = time.perf_counter()
    _fp8_gemm_tuned[grid](*args, **meta)
    best = _fp8_gemm_tuned.best_config
    row = {
        "M": named["M"],
        "N": named["N"],
        "K": named["K"],
        "configs": len(pruned),
        "compile_s": round(compiled - start, 3),
        "tune_s": round(time.perf_counter() - compiled, 3),
        "best": str(best),
    }
    TUNE_LOG.append(row)
    log = os.environ.get("QUANTSTUDY_TUNE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
    _store(key, configs.index(best))
