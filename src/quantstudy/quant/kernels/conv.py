"""A dense k x k convolution in FP8 as an implicit GEMM in Triton, with the fused product's
epilogue.

Why: the built-in recipes select dense kxk convs (res2net's 48 3x3 convs) that no PyTorch
library runs in FP8 on Hopper (cuDNN and cuBLASLt have no FP8 convolution there; torchao's
needs Blackwell), so the engine ran them quantize-dequantized in fp16: the quantize passes
without the FP8 product (docs/fp8-kernel.md, res2net's miss). Here the conv is the matrix
product y[m, n] = sum_k a[m, k] w[n, k] over output pixels m = (b, ho, wo) and k = (tap, c),
whose A matrix is never written: each K step loads one tap's channels of the rows' input
pixels straight from the channels-last FP8 map (pixels outside it read zero, which is the
zero padding). The epilogue is the fused product's (`gemm_kernel._finish`): per-output-channel
weight scale x the per-tensor input scale, folded-BN bias, activation, one write of the
channels-last output in the engine's dtype or as the next layer's FP8 input. Sums move to
float32 every PROMOTE products (`mma.mma_step`), as in the fused 1x1 product.

The kernel's name says "conv2d" and "fp8", so the profiler's grouping (`speed/kernels.py`)
counts it as an FP8 matrix product.

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from quantstudy.quant.kernels import launches, tuning
from quantstudy.quant.kernels.epilogue import (
    ACT_CODES,
    ROUND_CODES,
    activation,
    fp8_range,
    loop_bound,
    rounded,
)
from quantstudy.quant.kernels.mma import grouped_tile, mma_step
from quantstudy.quant.kernels.tiles import Config, bounded
from quantstudy.record.build_spec import PROMOTE

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): BLOCK_K is channels of one tap per K step. The
# order is the tie-break of `_prune`'s ranking: first the shapes that won the fused product's
# pointer path in its tile sweep (docs/fp8-kernel.md; the conv's K loop is that product's with
# pointer loads): 256x64x32 and 128x64x32, then 128x64 and 128x128 with the deeper K step
# nearest its 128x64x128 and 256x128x64 winners. Not measured on the conv itself.
TILES = [
    (256, 64, 32, 8, 3),
    (128, 64, 32, 4, 3),
    (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 32, 8, 3),
    (64, 64, 32, 4, 3),
    (128, 32, 32, 4, 4),
    (64, 32, 32, 4, 4),
    (64, 128, 64, 4, 3),
    (128, 256, 64, 8, 3),
]
FLOORS = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}  # no tile is smaller


def _tap_width(cin: int, c: Config) -> int:
    """Channels a tile's K steps cover per tap: CIN rounded up to its BLOCK_K."""
    return int(triton.cdiv(cin, c.kwargs["BLOCK_K"]) * c.kwargs["BLOCK_K"])


def _prune(configs: list[Config], named_args: dict[str, Any], **kwargs: Any) -> list[Config]:
    """At most `tiles.CONV_CONFIGS` tiles, ranked by `tiles.bounded` on M = B x HO x WO output
    pixels, N output channels and the CIN channels of one tap (BLOCK_K tiles a tap; K is KH x KW
    of them): no deeper than the sums promote (`PROMOTE`), and all padding each tap to the
    narrowest width any of them does (`_tap_width`). Why one width: between two promotions
    every kept tile then sums the same products, so all of them write the same bits, which an
    untimed launch relies on (`tuning.untimed_tiles`); a wider one only loads more zeros."""
    m, n, cin = named_args["M"], named_args["N"], named_args["CIN"]
    promote = {**named_args, **kwargs}.get("PROMOTE", PROMOTE)
    usable = [c for c in configs if not (promote and c.kwargs["BLOCK_K"] > promote)]
    if not usable:
        raise ValueError(f"no conv tile has BLOCK_K <= {promote} products per promotion")
    width = min(_tap_width(cin, c) for c in usable)
    same = [c for c in usable if _tap_width(cin, c) == width]
    sizes = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": cin}
    return bounded(same, sizes, FLOORS, grid=("BLOCK_M", "BLOCK_N"))


@triton.jit
def _fp8_conv2d_kernel(
    x_ptr, w_ptr, c_ptr, w_scale_ptr, x_scale_ptr, bias_ptr, out_scale_ptr,
    M, N, CIN, H, W, HO, WO,
    sxb, sxc, sxh, sxw, swn, scm, scn,
    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_FP8: tl.constexpr, ROUND: tl.constexpr,
    PROMOTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    wo = offs_m % WO
    ho = (offs_m // WO) % HO
    b = offs_m // (WO * HO)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    chunks = tl.cdiv(CIN, BLOCK_K)
    for i in tl.static_range(KH):
        hi = ho * SH - PH + i * DH
        for j in tl.static_range(KW):
            wi = wo * SW - PW + j * DW
            inside = m_ok & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            rows = x_ptr + b * sxb + hi * sxh + wi * sxw  # the tap's input pixel per row
            taps = w_ptr + offs_n * swn + (i * KW + j) * CIN  # the tap's weights per channel
            for c0 in range(0, loop_bound(chunks)):
                cs = c0 * BLOCK_K + offs_k
                c_ok = cs < CIN
                a = tl.load(
                    rows[:, None] + cs[None, :] * sxc,
                    mask=inside[:, None] & c_ok[None, :],
                    other=0.0,
                )
                w = tl.load(
                    taps[None, :] + cs[:, None], mask=n_ok[None, :] & c_ok[:, None], other=0.0
                )
                acc, part = mma_step(a, w, acc, part, (i * KW + j) * chunks + c0, BLOCK_K, PROMOTE)
    acc += part
    # The fused product's epilogue (`gemm_kernel._finish`, pointer store): scales and bias on
    # the float32 sums, rounded to the engine's dtype where the unfused engine stores, the
    # activation, then one write (fp16, or the next layer's FP8 input).
    scale = tl.load(w_scale_ptr + offs_n, mask=n_ok, other=0.0) * tl.load(x_scale_ptr)
    y = acc * scale[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    y = activation(rounded(y, ROUND), ACT)
    if OUT_FP8:
        y = fp8_range(rounded(y, ROUND), out_scale_ptr)
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    y = y.to(c_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(c_ptrs, y, mask=m_ok[:, None] & n_ok[None, :])


def _config(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    return triton.Config(meta, num_warps=warps, num_stages=stages)


# What the autotuner and the stored choice key on: sizes, then every compile-time option the
# launcher passes (`tuning.tuned_launch` checks it).
KEY = ["M", "N", "CIN", "H", "W", "HO", "WO", "SH", "SW", "PH", "PW", "DH", "DW", "KH", "KW"]
KEY += ["ACT", "HAS_BIAS", "OUT_FP8", "ROUND", "PROMOTE", "GROUP_M"]
FP8_CONV = tuning.autotuned(
    "fp8_conv2d", _fp8_conv2d_kernel, [_config(*t) for t in TILES], KEY, _prune
)


def conv_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Output size of a zero-padded convolution along one side (torch's formula)."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def tap_major(w8: torch.Tensor) -> torch.Tensor:
    """An (N, C, KH, KW) FP8 weight as the kernel reads it: (N, KH * KW * C), tap-major."""
    return w8.permute(0, 2, 3, 1).reshape(w8.shape[0], -1).contiguous()


def fp8_conv2d_triton(
    xq: torch.Tensor,
    w_taps: torch.Tensor,
    kernel_hw: Sequence[int],
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    tile: tuple[int, ...] | None = None,
    promote: int = 0,
) -> torch.Tensor:
    """Launch the conv: xq (B, C, H, W) FP8 E4M3 in any layout (channels-last reads
    coalesce), `w_taps` (N, KH * KW * C) FP8 from `tap_major`, w_scale (N,) and bias (N,)
    float32, x_scale a float32 scalar tensor; zero padding `padding` on each side. Returns a
    channels-last (B, N, HO, WO) map in `out_dtype`, or the next layer's FP8 input with
    `out_scale`. `round_to` as in `gemm.fp8_gemm_triton`. `tile` (BLOCK_M, BLOCK_N,
    BLOCK_K[, warps, stages]) fixes the tile; by default the autotuner picks it
    (`tuning.tuned_launch`: the stored choice, else tuned and stored).
    `promote` as in `gemm.fp8_gemm_triton` (tests set it to BLOCK_K to check the epilogue
    against float32 sums; a layer passes its `FP8LayerSpec.promote`). The launch record
    as in `gemm.fp8_gemm_triton` (`quant/kernels/launches.py`)."""
    if promote < 0 or (promote and promote & (promote - 1)):
        raise ValueError(f"promote must be 0 or a power of two, got {promote}")
    if xq.dtype != torch.float8_e4m3fn or w_taps.dtype != torch.float8_e4m3fn:
        raise ValueError(
            f"the FP8 conv reads E4M3 input and weight, got {xq.dtype}, {w_taps.dtype}"
        )
    if (out_scale is not None) != (out_dtype == torch.float8_e4m3fn):
        raise ValueError("an FP8 output needs out_scale, and out_scale needs an FP8 output")
    b, c, h, w = xq.shape
    kh, kw = kernel_hw
    n = w_taps.shape[0]
    if w_taps.shape[1] != kh * kw * c:
        raise ValueError(f"weight holds {w_taps.shape[1]} per channel, not {kh}x{kw}x{c}")
    ho = conv_out_size(h, kh, stride[0], padding[0], dilation[0])
    wo = conv_out_size(w, kw, stride[1], padding[1], dilation[1])
    out = torch.empty((b, ho, wo, n), device=xq.device, dtype=out_dtype)
    m = b * ho * wo
    if m == 0 or n == 0:
        return out.permute(0, 3, 1, 2)
    args = (
        xq, w_taps, out, w_scale, x_scale, bias if bias is not None else w_scale,
        out_scale if out_scale is not None else x_scale,
        m, n, c, h, w, ho, wo,
        xq.stride(0), xq.stride(1), xq.stride(2), xq.stride(3), w_taps.stride(0), n, 1,
    )  # fmt: skip
    meta = {
        "SH": stride[0], "SW": stride[1], "PH": padding[0], "PW": padding[1],
        "DH": dilation[0], "DW": dilation[1], "KH": kh, "KW": kw,
        "ACT": ACT_CODES[act], "HAS_BIAS": bias is not None, "OUT_FP8": out_scale is not None,
        "ROUND": ROUND_CODES[round_to or torch.float32], "PROMOTE": promote, "GROUP_M": 8,
    }  # fmt: skip

    sizes = {"M": m, "N": n, "CIN": c, "H": h, "W": w, "HO": ho, "WO": wo}
    key = launches.launch_key("fp8_conv2d", sizes, meta, (xq, w_taps, out))
    recorded = launches.replayed(key)
    if recorded is not None:  # traced into a package: the tile the study's launch ran with
        tile = recorded.sizes("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    if tile is None:
        launches.note(key, launches.Tile.of(tuning.tuned_launch(FP8_CONV, grid, args, meta)))
    else:
        bm, bn, bk, *launch = tile
        if promote and bk > promote:
            raise ValueError(f"BLOCK_K {bk} is more than the {promote} products per promotion")
        meta |= {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        if launch:
            meta |= {"num_warps": launch[0], "num_stages": launch[1]}
        launches.launchable(_fp8_conv2d_kernel)[grid](*args, **meta)
        launches.note(key, launches.Tile.given(("BLOCK_M", "BLOCK_N", "BLOCK_K"), tile))
    return out.permute(0, 3, 1, 2)
