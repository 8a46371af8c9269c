"""The fused FP8 matrix product's Triton kernel: FP8 operands, float32 accumulation, epilogue.

The arithmetic only (module docstring of `kernels/gemm.py` for what it computes): the tile
walks (one tile, streaming programs, persistent programs) and the epilogue's writes, plus the
autotuned wrapper over `kernels/tiles.py`'s tables. The tile order and promoted tensor-core sums
it shares with the conv kernel are in `kernels/mma.py`, the per-row quantizing prologue in
`kernels/row_prologue.py`; launching, argument checks and the tuning cache live beside it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantstudy.quant.kernels.epilogue import activation, fp8_range, loop_bound, rounded
from quantstudy.quant.kernels.mma import grouped_tile, mma_step
from quantstudy.quant.kernels.row_prologue import a_tile, row_amax, row_scales, to_e4m3
from quantstudy.quant.kernels.tiles import (
    PATH_TILES,
    PERSISTENT_TILES,
    STREAM_TILES,
    gemm_config,
    prune_gemm,
)
from quantstudy.quant.kernels.tuning import autotuned


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
    q_ptr, PAIR: tl.constexpr, out_w, out_hw, stride_cb, stride_ch, out_origin,
    MAP_OUT: tl.constexpr,
):  # fmt: skip
    """Epilogue: scales and bias on the float32 sums, the activation, then one write of the
    tile whose first row and column are `first_m`, `first_n`; with OUT_FP8, the write is the
    next FP8 layer's quantized input (divide by its scale, saturate at 448, round to nearest
    even: `quant.formats.fp8.to_fp8`'s arithmetic). With HAS_RES the residual tile (engine dtype,
    any strides) is added to the activated value and RES_ACT applied to the sum. With PAIR the
    tile is also written to `q_ptr` (same strides) as the next FP8 layer's input, quantized
    from the value stored in the engine's dtype with the scale at `out_scale_ptr`. The values are
    rounded to the engine's dtype (ROUND) wherever the unfused engine stores them (before the
    activation, both terms of the residual sum and the sum itself, before the FP8 write), so
    fused and unfused engines quantize the same numbers. With ROW_SCALE `x_rows` holds the
    tile's rows' activation scales. With MAP_OUT row m is pixel (b, h, w) of a map `out_w` wide
    and `out_hw` pixels per image, written at out_origin + b * stride_cb + h * stride_ch +
    w * stride_cm: the interior of a zero-padded buffer (`quant/rewrites/pad_handoff.py`), whose
    first element lies `out_origin` elements past `c_ptr`."""
    offs_m = first_m + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if ROW_SCALE:  # dynamic per-row activation scales: x_scale[m] * w_scale[n], as torch does
        y = acc * (scale[None, :] * x_rows[:, None]) + bias[None, :]
    else:
        y = acc * scale[None, :] + bias[None, :]
    y = activation(rounded(y, ROUND), ACT)
    if HAS_RES:
        r_ptrs = res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = activation(rounded(rounded(y, ROUND) + r, ROUND), RES_ACT)
    if OUT_FP8:
        y = fp8_range(rounded(y, ROUND), out_scale_ptr)
    if PAIR:
        q = fp8_range(rounded(y, ROUND), out_scale_ptr)
        q_ptrs = q_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(q_ptrs, q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    if TMA_STORE:  # one bulk copy per tile; rows and columns past the edge are not written
        c_desc.store([first_m, first_n], y.to(c_desc.dtype, fp_downcast_rounding="rtne"))
    else:
        if MAP_OUT:
            pixel = offs_m % out_hw
            rows = (offs_m // out_hw) * stride_cb + (pixel // out_w) * stride_ch
            rows += (pixel % out_w) * stride_cm + out_origin
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
def _tma_sums(a_desc, b_desc, first_m, first_n, K, acc, part, BLOCK_K: tl.constexpr,
              PROMOTE: tl.constexpr):  # fmt: skip
    """The K loop of one tile through tensor descriptors: no address arithmetic or masks, tiles
    past an edge arrive zero-filled and add nothing. The weight is K-major (N, K), so its tile is
    transposed in shared memory (`b.T`), the operand order FP8 wgmma takes."""
    for k0 in range(0, loop_bound(tl.cdiv(K, BLOCK_K))):
        a = a_desc.load([first_m, k0 * BLOCK_K])
        b = b_desc.load([first_n, k0 * BLOCK_K])
        acc, part = mma_step(a, b.T, acc, part, k0, BLOCK_K, PROMOTE)
    return acc, part


@triton.jit
def _pointer_sums(
    a_ptr, b_ptr, d_ptr, x_scale_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak,
    stride_bn, stride_bk, acc, part, QUANT_A: tl.constexpr, HAS_DIV: tl.constexpr,
    ROW_SCALE: tl.constexpr, PROMOTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The K loop of one tile through pointers (masked at every edge); with QUANT_A a first pass
    over K finds each row's scale and the loop quantizes the input's tiles in registers.
    Returns the sums and the rows' activation scales."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    if QUANT_A:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, loop_bound(tl.cdiv(K, BLOCK_K))):
            k_mask = offs_k < K - k0 * BLOCK_K
            a_mask = (offs_m[:, None] < M) & k_mask[None, :]
            ptrs = a_ptrs + k0 * BLOCK_K * stride_ak
            d_ptrs = d_ptr + k0 * BLOCK_K + offs_k
            amax = row_amax(a_tile(ptrs, a_mask, d_ptrs, k_mask, HAS_DIV), amax)
        x_rows = row_scales(amax)
        inv_rows = tl.math.div_rn(1.0, x_rows)  # torch.reciprocal: IEEE, once per row
    else:
        x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
    for k0 in range(0, loop_bound(tl.cdiv(K, BLOCK_K))):
        k_left = K - k0 * BLOCK_K
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < k_left)
        b_mask = (offs_n[None, :] < N) & (offs_k[:, None] < k_left)
        if QUANT_A:
            d_ptrs = d_ptr + k0 * BLOCK_K + offs_k
            a = a_tile(a_ptrs, a_mask, d_ptrs, offs_k < k_left, HAS_DIV)
            a = to_e4m3(a, inv_rows)
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc, part = mma_step(a, b, acc, part, k0, BLOCK_K, PROMOTE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc, part, x_rows


@triton.jit
def _persistent(
    a_desc, b_desc, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
    res_ptr, q_ptr, M, N, K, stride_cm, stride_cn, stride_rm, stride_rn,
    out_w, out_hw, stride_cb, stride_ch, out_origin,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_STORE: tl.constexpr, OUT_FP8: tl.constexpr,
    ROUND: tl.constexpr, PROMOTE: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_RES: tl.constexpr,
    RES_ACT: tl.constexpr, PAIR: tl.constexpr, MAP_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SUBTILE: tl.constexpr,
):  # fmt: skip
    """Persistent programs (a grid of at most one wave): each walks the output tiles in grouped
    order, its loads through tensor descriptors, so that one launch's programs stay resident and
    a tile's epilogue overlaps the next tile's first loads. With SUBTILE the epilogue finishes
    the tile in two halves along N (half the registers live at once, the first half's store in
    flight while the second is computed). Same sums per tile as the one-tile-per-program path."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in tl.range(
        loop_bound(tl.program_id(0)), loop_bound(tiles), loop_bound(tl.num_programs(0)),
    ):  # fmt: skip
        pid_m, pid_n = grouped_tile(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc, part = _tma_sums(
            a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, acc, tl.zeros_like(acc),
            BLOCK_K, PROMOTE,
        )  # fmt: skip
        acc += part
        first_m = pid_m * BLOCK_M
        x_rows = _rows_of(x_scale_ptr, first_m + tl.arange(0, BLOCK_M), M, ROW_SCALE, BLOCK_M)
        if SUBTILE:
            HALF: tl.constexpr = BLOCK_N // 2
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
            _finish_cols(
                left, first_m, pid_n * BLOCK_N, x_rows, M, N, c_ptr, c_desc, w_scale_ptr,
                x_scale_ptr, bias_ptr, out_scale_ptr, res_ptr, q_ptr, stride_cm, stride_cn,
                stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin, ACT,
                HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, ROW_SCALE, HAS_RES, RES_ACT, PAIR, MAP_OUT,
                BLOCK_M, HALF,
            )  # fmt: skip
            _finish_cols(
                right, first_m, pid_n * BLOCK_N + HALF, x_rows, M, N, c_ptr, c_desc, w_scale_ptr,
                x_scale_ptr, bias_ptr, out_scale_ptr, res_ptr, q_ptr, stride_cm, stride_cn,
                stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin, ACT,
                HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, ROW_SCALE, HAS_RES, RES_ACT, PAIR, MAP_OUT,
                BLOCK_M, HALF,
            )  # fmt: skip
        else:
            _finish_cols(
                acc, first_m, pid_n * BLOCK_N, x_rows, M, N, c_ptr, c_desc, w_scale_ptr,
                x_scale_ptr, bias_ptr, out_scale_ptr, res_ptr, q_ptr, stride_cm, stride_cn,
                stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin, ACT,
                HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, ROW_SCALE, HAS_RES, RES_ACT, PAIR, MAP_OUT,
                BLOCK_M, BLOCK_N,
            )  # fmt: skip


@triton.jit
def _finish_cols(
    acc, first_m, first_n, x_rows, M, N, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr,
    out_scale_ptr, res_ptr, q_ptr, stride_cm, stride_cn, stride_rm, stride_rn,
    out_w, out_hw, stride_cb, stride_ch, out_origin,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_STORE: tl.constexpr, OUT_FP8: tl.constexpr,
    ROUND: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_RES: tl.constexpr, RES_ACT: tl.constexpr,
    PAIR: tl.constexpr, MAP_OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """`_finish` of the BLOCK_N columns from `first_n` of a tile, with their channels' terms."""
    offs_n = first_n + tl.arange(0, BLOCK_N)
    scale, bias = _channel_terms(offs_n, N, w_scale_ptr, x_scale_ptr, bias_ptr, HAS_BIAS, ROW_SCALE)
    _finish(
        acc, scale, bias, first_m, first_n, M, N, c_ptr, c_desc, stride_cm, stride_cn,
        out_scale_ptr, ACT, TMA_STORE, OUT_FP8, ROUND, BLOCK_M, BLOCK_N, x_rows, ROW_SCALE,
        res_ptr, stride_rm, stride_rn, HAS_RES, RES_ACT, q_ptr, PAIR, out_w, out_hw, stride_cb,
        stride_ch, out_origin, MAP_OUT,
    )  # fmt: skip


@triton.jit
def _stream(
    a_ptr, b_ptr, d_ptr, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
    res_ptr, q_ptr, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_STORE: tl.constexpr, OUT_FP8: tl.constexpr,
    ROUND: tl.constexpr, PROMOTE: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_RES: tl.constexpr,
    RES_ACT: tl.constexpr, PAIR: tl.constexpr, QUANT_A: tl.constexpr, HAS_DIV: tl.constexpr,
    MAP_OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """A streaming program, for thin products (K <= BLOCK_K, N <= BLOCK_N, see `prune_gemm`):
    it keeps the whole weight, its scales and bias in registers and walks over row tiles, so
    the loads of the next tile are in flight (software-pipelined loop) while this one is
    finished and stored."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    b = tl.load(b_ptrs, mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
    scale, bias = _channel_terms(offs_n, N, w_scale_ptr, x_scale_ptr, bias_ptr, HAS_BIAS, ROW_SCALE)
    first, tiles, step = tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)
    for tile in tl.range(loop_bound(first), loop_bound(tiles), loop_bound(step)):
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        if QUANT_A:
            a = a_tile(a_ptrs, a_mask, d_ptr + offs_k, offs_k < K, HAS_DIV)
            x_rows = row_scales(row_amax(a, tl.zeros((BLOCK_M,), dtype=tl.float32)))
            a = to_e4m3(a, tl.math.div_rn(1.0, x_rows))
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc, part = mma_step(a, b, acc, tl.zeros_like(acc), 0, BLOCK_K, PROMOTE)
        acc += part
        _finish(
            acc, scale, bias, tile * BLOCK_M, 0, M, N, c_ptr, c_desc, stride_cm, stride_cn,
            out_scale_ptr, ACT, TMA_STORE, OUT_FP8, ROUND, BLOCK_M, BLOCK_N,
            x_rows, ROW_SCALE, res_ptr, stride_rm, stride_rn, HAS_RES, RES_ACT,
            q_ptr, PAIR, out_w, out_hw, stride_cb, stride_ch, out_origin, MAP_OUT,
        )  # fmt: skip


# QUANT_A: `a` is the unquantized input in the engine's dtype (pointer loads only); each row's
# scale is its max |x| x float32(1/448) (a first pass over K), its tiles quantized in registers
# in the main loop (a second pass, from L2 where K spans several tiles), and the epilogue
# applies the row scales: dynamic per-row FP8 without a quantize pass.
@triton.jit
def _fp8_gemm_kernel(
    a_ptr, a_desc, b_ptr, b_desc, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
    res_ptr, q_ptr, d_ptr, M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn, stride_rm, stride_rn,
    out_w, out_hw, stride_cb, stride_ch, out_origin,  # MAP_OUT: the output's map (`_finish`)
    tma_loads_ok, tma_store_ok,  # 0 or 1: the paths this launch allows (autotuner key, prune)
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_LOADS: tl.constexpr, TMA_STORE: tl.constexpr,
    OUT_FP8: tl.constexpr, ROUND: tl.constexpr, PROMOTE: tl.constexpr, ROW_SCALE: tl.constexpr,
    HAS_RES: tl.constexpr, RES_ACT: tl.constexpr, PAIR: tl.constexpr,
    QUANT_A: tl.constexpr, HAS_DIV: tl.constexpr,  # input quantized per row here (prologue)
    MAP_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STREAM: tl.constexpr, PER_SM: tl.constexpr,  # PER_SM: programs per SM (grid), STREAM only
    PERSISTENT: tl.constexpr, SUBTILE: tl.constexpr,  # persistent tile loop (`_persistent`)
):  # fmt: skip
    if PERSISTENT:
        _persistent(
            a_desc, b_desc, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
            res_ptr, q_ptr, M, N, K, stride_cm, stride_cn, stride_rm, stride_rn,
            out_w, out_hw, stride_cb, stride_ch, out_origin,
            ACT, HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, PROMOTE, ROW_SCALE, HAS_RES, RES_ACT, PAIR,
            MAP_OUT, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SUBTILE,
        )  # fmt: skip
    elif STREAM:
        _stream(
            a_ptr, b_ptr, d_ptr, c_ptr, c_desc, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
            res_ptr, q_ptr, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_cm,
            stride_cn, stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin,
            ACT, HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, PROMOTE, ROW_SCALE, HAS_RES, RES_ACT, PAIR,
            QUANT_A, HAS_DIV, MAP_OUT, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    else:
        pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA_LOADS:
            # No address arithmetic or masks in the loop: tiles past an edge arrive
            # zero-filled, so they add nothing to the sums.
            x_rows = _rows_of(x_scale_ptr, offs_m, M, ROW_SCALE, BLOCK_M)
            acc, part = _tma_sums(
                a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, acc, part, BLOCK_K, PROMOTE
            )
        else:
            acc, part, x_rows = _pointer_sums(
                a_ptr, b_ptr, d_ptr, x_scale_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak,
                stride_bn, stride_bk, acc, part, QUANT_A, HAS_DIV, ROW_SCALE, PROMOTE, BLOCK_M,
                BLOCK_K,
            )  # fmt: skip
        acc += part
        _finish_cols(
            acc, pid_m * BLOCK_M, pid_n * BLOCK_N, x_rows, M, N, c_ptr, c_desc, w_scale_ptr,
            x_scale_ptr, bias_ptr, out_scale_ptr, res_ptr, q_ptr, stride_cm, stride_cn,
            stride_rm, stride_rn, out_w, out_hw, stride_cb, stride_ch, out_origin, ACT,
            HAS_BIAS, TMA_STORE, OUT_FP8, ROUND, ROW_SCALE, HAS_RES, RES_ACT, PAIR, MAP_OUT,
            BLOCK_M, BLOCK_N,
        )  # fmt: skip


# The autotuned kernel (CUDA) over `PATH_TILES`, pointer paths first (they always apply). The
# plain kernel stays callable with one fixed tile, which is how the CPU tests run it under
# TRITON_INTERPRET=1 (the autotuner needs a GPU to time configs).
# What the autotuner and the stored choice key on: sizes, every compile-time option the launcher
# passes (`tuning.tuned_launch` checks it) and the descriptor paths the launch allows (ROW_SCALE:
# dynamic per-row activation scales; HAS_RES: a residual sum in the epilogue; MAP_OUT: a padded
# buffer's interior written).
AUTOTUNE_KEY = ["M", "N", "K", "ACT", "HAS_BIAS", "OUT_FP8", "PROMOTE", "ROW_SCALE"]
AUTOTUNE_KEY += ["HAS_RES", "RES_ACT", "PAIR", "QUANT_A", "HAS_DIV", "MAP_OUT", "ROUND", "GROUP_M"]
AUTOTUNE_KEY += ["tma_loads_ok", "tma_store_ok"]
FP8_GEMM = autotuned(
    "fp8_gemm",
    _fp8_gemm_kernel,
    [
        *(
            gemm_config(*t, loads, store)
            for (loads, store), tiles in PATH_TILES.items()
            for t in tiles
        ),
        *(gemm_config(*t[:5], False, store, t[5]) for store in (False, True) for t in STREAM_TILES),
        *(  # timed only with fast accumulation on deep products (`tiles.persistent_pays`)
            gemm_config(*t[:5], True, store, persistent=True, subtile=t[5])
            for store in (False, True)
            for t in PERSISTENT_TILES
        ),
    ],
    AUTOTUNE_KEY,
    prune_gemm,
    hooked=("a_desc", "b_desc", "c_desc"),  # a config's pre-hook gives them its block shape
)
