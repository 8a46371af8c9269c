"""A depthwise convolution as a Triton kernel on channels-last maps, FP8 or fp16 in and out.

Why: the largest byte saving left in the inverted-residual CNNs is the expanded tensor around
each depthwise conv (docs/fp8-kernel.md, "All six models"):
the 1x1 conv before it could write it in FP8, and the depthwise conv could write the next FP8
layer's input, if the depthwise conv read and wrote FP8. cuDNN's depthwise kernels read and
write fp16 only. This kernel reads either (an FP8 map with its per-tensor scale), sums in
float32, applies bias and activation, and writes fp16 or FP8 (divide by the next layer's scale,
saturate, round to nearest even). `quant/layers/fused_depthwise.py` puts it in the fused engine;
`quantstudy bench depthwise` times it against cuDNN.

Each program computes BLOCK_P output pixels x BLOCK_C channels; channels are contiguous in a
channels-last map, so every tap is one coalesced load per pixel row. Padding is given as the
top/left amount (TensorFlow "same" padding is asymmetric); pixels past the map read zero.

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from quantstudy.quant.kernels import launches, tuning
from quantstudy.quant.kernels.epilogue import ACT_CODES, activation, fp8_range
from quantstudy.quant.kernels.layout import taps_of
from quantstudy.quant.kernels.tiles import Config, bounded
from quantstudy.record.vocab import Activation


@triton.jit
def _depthwise_kernel(
    x_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, x_scale_ptr, out_scale_ptr,
    P, H, W, C, HO, WO, PAD_H, PAD_W,
    sxb, sxh, sxw, syp,
    STRIDE: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, ACT: tl.constexpr,
    X_FP8: tl.constexpr, W_FP8: tl.constexpr, OUT_FP8: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_mask = offs_p < P
    c_mask = offs_c < C
    wo = offs_p % WO
    ho = (offs_p // WO) % HO
    b = offs_p // (WO * HO)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for i in tl.static_range(KH):
        hi = ho * STRIDE - PAD_H + i
        for j in tl.static_range(KW):
            wi = wo * STRIDE - PAD_W + j
            ok = p_mask & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            rows = x_ptr + b * sxb + hi * sxh + wi * sxw
            x = tl.load(
                rows[:, None] + offs_c[None, :], mask=ok[:, None] & c_mask[None, :], other=0.0
            )
            w = tl.load(w_ptr + (i * KW + j) * C + offs_c, mask=c_mask, other=0.0)
            acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
    if W_FP8:  # FP8 taps: their per-channel scale after the sum, as the fused products do
        acc = acc * tl.load(ws_ptr + offs_c, mask=c_mask, other=0.0)[None, :]
    if X_FP8:
        acc = acc * tl.load(x_scale_ptr)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_c, mask=c_mask, other=0.0)[None, :]
    acc = activation(acc, ACT)
    if OUT_FP8:
        acc = fp8_range(acc, out_scale_ptr)
    y = acc.to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    ptrs = y_ptr + offs_p[:, None] * syp + offs_c[None, :]
    tl.store(ptrs, y, mask=p_mask[:, None] & c_mask[None, :])


# (BLOCK_P, BLOCK_C, warps): pixels x channels per program. Channels are the contiguous axis of
# a channels-last map, so wide BLOCK_C keeps loads coalesced; narrow maps (C 16-96) want
# more pixels per program instead. `quantstudy bench depthwise` times each; the engine's
# autotuner picks among them.
TILES = [(64, 64, 4), (32, 128, 4), (128, 32, 4), (64, 128, 8), (16, 256, 8), (128, 64, 8)]


FLOORS = {"BLOCK_P": 16, "BLOCK_C": 32}  # no tile is smaller


def _prune(configs: list[Config], named_args: dict[str, Any], **kwargs: Any) -> list[Config]:
    """At most `tiles.CONV_CONFIGS` tiles, ranked by `tiles.bounded` on P output pixels and C
    channels. Every tile writes the same bits: each output sums its taps in one order in
    float32, whatever the tile."""
    sizes = {"BLOCK_P": named_args["P"], "BLOCK_C": named_args["C"]}
    return bounded(configs, sizes, FLOORS, grid=("BLOCK_P", "BLOCK_C"))


# What the autotuner and the stored choice key on: sizes, then every compile-time option the
# launcher passes (`tuning.tuned_launch` checks it).
KEY = ["P", "C", "H", "W", "HO", "WO", "PAD_H", "PAD_W", "STRIDE", "KH", "KW", "ACT"]
KEY += ["X_FP8", "W_FP8", "OUT_FP8", "HAS_BIAS"]
DEPTHWISE = tuning.autotuned(
    "depthwise",
    _depthwise_kernel,
    [triton.Config({"BLOCK_P": p, "BLOCK_C": c}, num_warps=w) for p, c, w in TILES],
    KEY,
    _prune,
)


def depthwise_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    pad: Sequence[int],
    out_hw: Sequence[int],
    act: str = Activation.NONE,
    x_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
    tile: tuple[int, int, int] = (64, 64, 4),
) -> torch.Tensor:
    """Depthwise conv of a channels-last map `x` (B, C, H, W; FP8 with `x_scale`, or float)
    with `weight` (C, 1, KH, KW) and `bias` (C,), both float32; returns a channels-last
    (B, C, HO, WO) map in `out_dtype`, or FP8 quantized with `out_scale`. `pad` is the top/left
    padding, `tile` (BLOCK_P, BLOCK_C, warps). For tests: engines store `taps_of` once."""
    kh, kw = weight.shape[-2:]
    taps = taps_of(weight.float())  # float32 taps: no weight scale
    return depthwise_taps(
        x, taps, (kh, kw), bias, stride, pad, out_hw, act, x_scale, out_scale, out_dtype, tile
    )


def depthwise_taps(
    x: torch.Tensor,
    taps: torch.Tensor,
    kernel_hw: Sequence[int],
    bias: torch.Tensor | None,
    stride: int,
    pad: Sequence[int],
    out_hw: Sequence[int],
    act: str = Activation.NONE,
    x_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
    tile: tuple[int, int, int] | None = None,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`depthwise_conv` with the weight given as `taps` (KH * KW, C), one row of channels per
    tap: what an engine layer stores once instead of reshaping per call; float32, or FP8 with
    its per-channel float32 `w_scale` (C,). `tile` None: the autotuner picks it (`TILES`;
    `tuning.tuned_launch`: the stored choice, else timed from CUDA-graph replays and stored).
    The launch record as in `gemm.fp8_gemm_triton` (`quant/kernels/launches.py`)."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("the depthwise kernel reads channels-last maps")
    if (x.dtype == torch.float8_e4m3fn) != (x_scale is not None):
        raise ValueError("an FP8 input needs x_scale, and x_scale an FP8 input")
    if (out_scale is not None) != (out_dtype == torch.float8_e4m3fn):
        raise ValueError("an FP8 output needs out_scale, and out_scale an FP8 output")
    b, c, h, w = x.shape
    kh, kw = kernel_hw
    if taps.shape != (kh * kw, c):
        raise ValueError(f"taps must be ({kh * kw}, {c}), got {tuple(taps.shape)}")
    if (taps.dtype == torch.float8_e4m3fn) != (w_scale is not None):
        raise ValueError("FP8 taps need w_scale, and w_scale FP8 taps")
    ho, wo = out_hw
    y = torch.empty((b, c, ho, wo), device=x.device, dtype=out_dtype)
    y = y.contiguous(memory_format=torch.channels_last)
    one = torch.ones((), device=x.device)
    args = (
        x, taps, w_scale if w_scale is not None else one, bias if bias is not None else one, y,
        x_scale if x_scale is not None else one, out_scale if out_scale is not None else one,
        b * ho * wo, h, w, c, ho, wo, pad[0], pad[1],
        x.stride(0), x.stride(2), x.stride(3), y.stride(3),
    )  # fmt: skip
    meta = {
        "STRIDE": stride, "KH": kh, "KW": kw, "ACT": ACT_CODES[act],
        "X_FP8": x_scale is not None, "W_FP8": w_scale is not None,
        "OUT_FP8": out_scale is not None,
        "HAS_BIAS": bias is not None,
    }  # fmt: skip

    sizes = {"P": b * ho * wo, "H": h, "W": w, "C": c, "HO": ho, "WO": wo}
    sizes |= {"PAD_H": pad[0], "PAD_W": pad[1]}
    key = launches.launch_key("fp8_depthwise", sizes, meta, (x, taps, y))
    recorded = launches.replayed(key)
    if recorded is not None:  # traced into a package: the tile the study's launch ran with
        block_p, block_c, warps = recorded.sizes("BLOCK_P", "BLOCK_C", "num_warps")
        tile = (block_p, block_c, warps)

    def grid(m: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(b * ho * wo, m["BLOCK_P"]), triton.cdiv(c, m["BLOCK_C"]))

    if tile is None:
        config = tuning.tuned_launch(DEPTHWISE, grid, args, meta)
        launches.note(key, launches.Tile.of(config))
    else:
        block_p, block_c, warps = tile
        kernel = launches.launchable(_depthwise_kernel)
        kernel[grid](*args, **meta, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps)
        launches.note(key, launches.Tile.given(("BLOCK_P", "BLOCK_C"), tile))
    return y
