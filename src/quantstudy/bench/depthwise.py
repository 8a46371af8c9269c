"""`quantstudy bench depthwise`: each depthwise conv of a model alone, cuDNN in fp16 against the
Triton kernel of `quant/kernels/depthwise.py` reading and writing fp16 or FP8.

FP8 storage around the depthwise convs saves bytes only if a depthwise kernel that reads FP8 runs
about as fast as cuDNN's fp16 one on the same map (docs/fp8-kernel.md). For every unique
depthwise conv (`shapes.py`; random weights) at one batch, timed by the kernel timer
(`gpu/timer.py`: the mean of CUDA-graph replays, 20 ms of calls each, after one eager call):

- "cudnn fp16": the conv module in fp16 on a channels-last input, as the fp16 engine runs it;
- "triton fp16": the Triton kernel on the same input, fp16 out;
- "triton fp8 in": FP8 input (per-tensor scale), fp16 out;
- "triton fp8 in/out": FP8 input, FP8 output (the next FP8 layer's input);

each Triton variant at its fastest of `quant/kernels/depthwise.TILES` (the weight reshaped to taps
once, as the engine's layer stores it), its result checked against the fp16 conv. Each row
carries the bytes every variant moves and their roofline. On a machine without CUDA,
`--shapes-only` lists the convs, bytes and rooflines.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantstudy.bench.provenance import collect_provenance, need_cuda
from quantstudy.bench.schema import DepthwiseBench, DepthwiseRow, write_unfinished
from quantstudy.bench.shapes import DepthwiseConv, depthwise_convs, roofline_bandwidth
from quantstudy.gpu.timer import time_us
from quantstudy.record.vocab import Activation

# variant -> (input bytes, output bytes) per element
ELEMENT_BYTES = {
    "cudnn fp16": (2, 2),
    "triton fp16": (2, 2),
    "triton fp8 in": (1, 2),
    "triton fp8 in/out": (1, 1),
}


def bench_depthwise(
    model: str,
    batch: int,
    *,
    shapes_only: bool = False,
    argv: list[str] | None = None,
    out: Path | None = None,
) -> DepthwiseBench:
    device = torch.device("cpu")
    if not shapes_only:
        device = need_cuda("bench depthwise", " (--shapes-only lists the convs on any machine)")
    convs, skipped = depthwise_convs(model, batch)
    for name in skipped:
        print(f"skipped {name}: the kernel runs one stride for both axes, no dilation")
    provenance = collect_provenance(device, argv)
    bandwidth = roofline_bandwidth(device)

    def record(rows: list[DepthwiseRow]) -> DepthwiseBench:
        return DepthwiseBench(
            provenance=provenance,
            meaningful=not shapes_only,
            meaningless_reason="shapes and bytes only, nothing timed" if shapes_only else None,
            batch=batch,
            bandwidth=bandwidth,
            results=rows,
        )

    rows: list[DepthwiseRow] = []
    for conv in convs:
        row = _row(model, conv, bandwidth)
        if not shapes_only:
            row = row.model_copy(update=time_conv(conv))
            print(
                f"C {conv.c:>5} k{conv.k} s{conv.stride} in {conv.input[2]}x{conv.input[3]}: "
                + ", ".join(f"{k} {v:.1f} us" for k, v in row.us.items()),
                flush=True,
            )
        rows.append(row)
        write_unfinished(out, record(rows), len(rows), len(convs), "convs")
    return record(rows)


def _row(model: str, conv: DepthwiseConv, bandwidth: float) -> DepthwiseRow:
    nbytes = {k: conv.moved_bytes(x, y) for k, (x, y) in ELEMENT_BYTES.items()}
    return DepthwiseRow(
        model=model,
        c=conv.c,
        k=conv.k,
        stride=conv.stride,
        input=conv.input,
        output=conv.output,
        pad=conv.pad,
        layers=conv.layers,
        bytes=nbytes,
        roofline_us={k: v / bandwidth * 1e6 for k, v in nbytes.items()},
    )


def time_conv(row: DepthwiseConv) -> dict[str, Any]:
    """The DepthwiseRow fields `us`, `best_tile` and `max_rel_error` of one conv."""
    from quantstudy.quant.kernels.depthwise import TILES, depthwise_taps
    from quantstudy.quant.kernels.layout import taps_of

    dev = torch.device("cuda")
    conv = copy.deepcopy(row.module).to(dev, torch.float16).to(memory_format=torch.channels_last)
    x16 = torch.randn(row.input, device=dev, dtype=torch.float16)
    x16 = x16.contiguous(memory_format=torch.channels_last)
    x_scale = x16.abs().amax().float() / 448
    x8 = (x16.float() / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    x8 = x8.contiguous(memory_format=torch.channels_last)
    kh, kw = conv.kernel_size
    taps = taps_of(conv.weight.float())
    bias = conv.bias.float() if conv.bias is not None else None
    with torch.no_grad():
        ref = conv(x16).float()
    out_scale = ref.abs().amax() / 448
    hw, pad, s = tuple(row.output[2:]), tuple(row.pad), row.stride
    variants = {
        "triton fp16": (x16, None, None, torch.float16),
        "triton fp8 in": (x8, x_scale, None, torch.float16),
        "triton fp8 in/out": (x8, x_scale, out_scale, torch.float8_e4m3fn),
    }
    us = {"cudnn fp16": _us(lambda: conv(x16))}
    best_tile: dict[str, list[int]] = {}
    errors: dict[str, float] = {}
    for label, (x, xs, os_, dtype) in variants.items():

        def call(
            tile: tuple[int, int, int], x: Any = x, xs: Any = xs, os_: Any = os_, dtype: Any = dtype
        ) -> torch.Tensor:
            return depthwise_taps(
                x, taps, (kh, kw), bias, s, pad, hw, Activation.NONE, xs, os_, dtype, tile
            )

        times = {tile: _us(functools.partial(call, tile)) for tile in TILES}
        tile = min(times, key=lambda t: times[t])
        us[label], best_tile[label] = times[tile], list(tile)
        y = call(tile).float() * (os_ if os_ is not None else 1.0)
        errors[label] = float(((y - ref).abs() / (ref.abs() + 1)).max())
    return {"us": us, "best_tile": best_tile, "max_rel_error": errors}


def _us(fn: Callable[[], object]) -> float:
    """One variant's time per call (the module docstring)."""
    return time_us(fn, rep=20, stat="mean", eager=True)
