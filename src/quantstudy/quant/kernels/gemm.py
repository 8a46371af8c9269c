"""The fused FP8 matrix product as a Triton kernel: FP8 operands, float32 accumulation, epilogue.

y[m, n] = act(acc[m, n] * x_scale * w_scale[n] + bias[n]), acc = sum_k xq[m, k] * w8[n, k],
optionally followed by a residual sum and its activation, res_act(y[m, n] + r[m, n])
(`quant/rewrites/residual.py`), written once in the engine's dtype, or as the next FP8 layer's
quantized input (FP8 hand-off), or both (a residual sum that is also the next FP8 layer's input). An
input in the engine's dtype is quantized in the kernel with dynamic per-row scales (QUANT_A).
cuBLASLt's FP8 kernel (torch._scaled_mm) writes bf16 and needs a row-wise activation scale
tensor of M elements plus a separate pass for the activation; here the per-channel scale,
folded-BatchNorm bias and activation ride in the epilogue, the activation scale is read from
device memory (no host sync, no M-sized tensor), and any K and N work (masked loads; the fused
layer still pads K to 16 so that rows take 16-byte loads, see `quant/layers/fused_matmul.py`).

Per product the autotuner picks the tile, whether operands are read and the output written
through pointers or through tensor descriptors (Hopper's bulk copy engine, TMA), and, for thin
products, streaming programs that keep the weight and walk over row tiles. Why each exists, and
what was measured, is in docs/fp8-kernel.md.

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton

from quantstudy.env.machine import gpu_capability
from quantstudy.quant.kernels import launches
from quantstudy.quant.kernels.epilogue import ACT_CODES, ROUND_CODES
from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
from quantstudy.quant.kernels.tiles import IO_PATHS, set_block_shapes
from quantstudy.quant.kernels.tuning import Args, Grid, tuned_launch
from quantstudy.record.vocab import Activation

try:  # Triton 3.3+ (torch 2.7+); older ones keep the pointer paths only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

BLOCKS = ("BLOCK_M", "BLOCK_N", "BLOCK_K")  # a tile's block sizes, in `tile`'s order


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: any count exercises the loop over tiles
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D operand can go through a tensor descriptor: a Hopper or newer GPU (or the
    interpreter) and a Triton that has them, unit last stride, 16-byte aligned base and row
    stride."""
    if TensorDescriptor is None:
        return False
    if t.is_cuda and gpu_capability(t.device)[0] < 9:
        return False
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return bool(
        t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def _checked_output(
    xq: torch.Tensor,
    w8: torch.Tensor,
    out_dtype: torch.dtype,
    out_scale: torch.Tensor | None,
    promote: int,
    loads: str | None,
    store: str | None,
    residual: torch.Tensor | None,
    pair: torch.Tensor | None,
    x_inv_divisor: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The output `fp8_gemm_triton` writes (`out` checked, or a new (M, N) tensor), after
    checking that its arguments describe one launch the kernel supports: a wrong combination
    raises here with its reason instead of computing something else."""
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
    if out is not None:  # mapped
        if out.dim() != 4 or out.shape[0] * out.shape[1] * out.shape[2] != m or out.shape[3] != n:
            raise ValueError(f"a mapped output is (B, H, W, {n}) with B x H x W = {m} rows")
        if out.dtype != out_dtype or pair is not None:
            raise ValueError(f"a mapped output is one {out_dtype} tensor, without an FP8 copy")
    else:
        out = torch.empty((m, n), device=xq.device, dtype=out_dtype)
    if pair is not None and (tuple(pair.shape) != (m, n) or pair.stride() != out.stride()):
        raise ValueError(f"the FP8 copy must be a contiguous ({m}, {n}) tensor")
    return out


def _checked_base(out: torch.Tensor, base: torch.Tensor) -> int:
    """Where a mapped `out` starts in `base`, the dense (B, H', W', N) buffer it is a view of
    (elements past base's first): the kernel is then handed `base` and that origin. Why: a
    tracer turns a kernel's write through a view into a copy of the view and a scatter back,
    which torch 2.11 gets wrong for a strided view or a view with an offset
    (`quant/layers/fused_matmul.py: fp8_gemm_padded`);
    a write into the whole buffer is no view at all. Under tracing there is no data pointer to
    compare, so `out` is held to the buffer by its strides and its span."""
    origin: int = out.storage_offset() - base.storage_offset()  # (a SymInt while traced)
    pairs = zip(out.shape, out.stride(), strict=True)
    reach = origin + sum((size - 1) * stride for size, stride in pairs)
    if base.dim() != 4 or not base.is_contiguous() or out.stride() != base.stride():
        raise ValueError("out_base is the dense (B, H, W, N) buffer whose interior `out` views")
    if base.dtype != out.dtype or base.device != out.device:
        raise ValueError(f"out_base must be {out.dtype} on {out.device}")
    outside = isinstance(reach, int) and not 0 <= origin <= reach < base.numel()
    if outside:  # (symbolic under a dynamic batch: the caller's view then stands for itself)
        raise ValueError("out does not lie inside out_base")
    return origin


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
    promote: int = 0,
    residual: torch.Tensor | None = None,
    res_act: str = Activation.NONE,
    pair: torch.Tensor | None = None,
    x_inv_divisor: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_base: torch.Tensor | None = None,
    persistent: bool = False,
    subtile: bool = False,
) -> torch.Tensor:
    """Launch the kernel: xq (M, K) and w8 (N, K) in FP8 E4M3, w_scale (N,) and bias (N,)
    float32, x_scale a float32 scalar tensor or one scale per row ((M, 1)); returns (M, N) in
    `out_dtype`. An `xq` in the engine's dtype is quantized here with dynamic per-row scales
    (`quant.formats.fp8.quantize_rows`), divided first by `x_inv_divisor` ((K,)) where given; w8
    may then be wider than K.

    By default the autotuner picks the tile, the streaming programs for thin products and, where
    `tma_ok` allows, the I/O paths ("pointer" `loads` or `store` keeps that side off
    descriptors). `tile` (BLOCK_M, BLOCK_N, BLOCK_K[, warps, stages]) fixes it, with pointers
    unless "tma" is asked; `stream` > 0 runs it as that many streaming programs per SM; with
    "tma" loads, `persistent` runs one wave of programs that walk the tiles, `subtile` finishing
    each in two halves (`_persistent`).
    `out_scale` writes the output as FP8 with that scale (`out_dtype` E4M3), or with `pair`
    ((M, N) FP8) a copy beside the `out_dtype` output. `round_to` is where the epilogue rounds
    (`_finish`); `promote` how many products the tensor cores sum before float32 takes over
    (`mma_step`; 0: all of K; a layer passes its `FP8LayerSpec.promote`).
    `residual` ((M, N), any strides) is added after the activation, then `res_act`. `out`
    (B, H, W, N), B x H x W = M, any strides (a padded buffer's interior,
    `quant/rewrites/pad_handoff.py`) receives the output pixel by pixel, through `out_base` (the
    buffer it views) where given (`_checked_base`).

    Each launch notes its tile in the launch record; within `launches.replaying` it takes the
    tile recorded for it, through pointers and torch's `wrap_triton` (`kernels/launches.py`)."""
    out = _checked_output(
        xq, w8, out_dtype, out_scale, promote, loads, store, residual, pair, x_inv_divisor, out
    )
    target, origin = (out, 0) if out_base is None else (out_base, _checked_base(out, out_base))
    quant_a, mapped = xq.dtype != torch.float8_e4m3fn, out.dim() == 4
    (m, k), n = xq.shape, w8.shape[0]
    if m == 0:
        return out
    meta = _options(act, bias, x_scale, quant_a, x_inv_divisor, residual, res_act, pair, mapped)
    meta |= {"OUT_FP8": out_scale is not None and pair is None}
    meta |= {"ROUND": ROUND_CODES[round_to or torch.float32], "PROMOTE": _promotion(k, promote)}
    tensors = (xq, w8, out, *(t for t in (residual, pair) if t is not None))
    key = launches.launch_key("fp8_gemm", {"M": m, "N": n, "K": k}, meta, tensors)
    tile, stream = _replayed(key, tile, stream)
    use_loads, use_store = _io_paths(xq, w8, out, tile is None, loads, store)
    descs = {
        "a_desc": _descriptor(xq, use_loads),
        "b_desc": _descriptor(w8, use_loads),
        "c_desc": _descriptor(out, use_store),
    }
    args = _kernel_args(
        xq, w8, out, target, origin, descs, (w_scale, x_scale, bias, out_scale),
        (residual, pair, x_inv_divisor), (use_loads, use_store),
    )  # fmt: skip
    grid = functools.partial(_grid, m, n, xq.device)
    if tile is None:
        launches.note(key, launches.Tile.of(tuned_launch(FP8_GEMM, grid, args, meta)))
        return out
    loop = {"PERSISTENT": persistent, "SUBTILE": subtile}
    _fixed_launch(grid, args, descs, meta | loop, tile, stream, (n, k))
    launches.note(key, launches.Tile.given(BLOCKS, tile, stream, use_loads or use_store))
    return out


def _io_paths(
    xq: torch.Tensor,
    w8: torch.Tensor,
    out: torch.Tensor,
    tuned: bool,
    loads: str | None,
    store: str | None,
) -> tuple[bool, bool]:
    """Whether the loads and the store go through tensor descriptors: where asked (by default
    when tuned and allowed) and where the tensors permit it; an asked path they refuse is an
    error, not a quiet fallback."""
    quant_a, mapped = xq.dtype != torch.float8_e4m3fn, out.dim() == 4
    default = "tma" if tuned and launches.descriptors_allowed() else "pointer"
    use_loads = (loads or default) == "tma" and tma_ok(xq) and tma_ok(w8) and not quant_a
    use_store = (store or default) == "tma" and not mapped and tma_ok(out)
    if (loads == "tma" and not use_loads) or (store == "tma" and not use_store):
        raise ValueError("tensor descriptors need 16-byte aligned rows on a Hopper GPU")
    return use_loads, use_store


def _kernel_args(
    xq: torch.Tensor,
    w8: torch.Tensor,
    out: torch.Tensor,
    target: torch.Tensor,
    origin: int,
    descs: dict[str, Any],
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    extras: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    paths: tuple[bool, bool],
) -> tuple[Any, ...]:
    """The kernel's positional arguments in its signature's order (`gemm_kernel.py`): an
    absent tensor passed as one that is there (its flag keeps it unread), then the sizes,
    strides and the pixel map of a 4-D `out`."""
    w_scale, x_scale, bias, out_scale = scales
    residual, pair, x_inv_divisor = extras
    mapped = out.dim() == 4
    (m, k), n = xq.shape, w8.shape[0]
    return (
        xq, descs["a_desc"], w8, descs["b_desc"], target, descs["c_desc"],
        w_scale, x_scale, bias if bias is not None else w_scale,
        out_scale if out_scale is not None else x_scale,
        residual if residual is not None else target,
        pair if pair is not None else target,
        x_inv_divisor if x_inv_divisor is not None else w_scale,
        m, n, k,
        xq.stride(0), xq.stride(1), w8.stride(0), w8.stride(1),
        *((out.stride(2), out.stride(3)) if mapped else out.stride()),
        *(residual.stride() if residual is not None else (0, 0)),
        *((out.shape[2], out.shape[1] * out.shape[2], out.stride(0), out.stride(1), origin)
          if mapped else (1, 1, 0, 0, 0)),
        int(paths[0]), int(paths[1]),
    )  # fmt: skip


def _grid(m: int, n: int, device: torch.device, meta: dict[str, Any]) -> tuple[int]:
    """Programs of a launch: a tile each, or at most SMs x PER_SM streaming programs, or one
    wave of persistent ones. The SM count is asked for only then: a package traced on a machine
    without the GPU launches tiles alone."""
    tiles_m = triton.cdiv(m, meta["BLOCK_M"])
    if meta["STREAM"]:
        return (min(tiles_m, _sm_count(device) * meta["PER_SM"]),)
    tiles = tiles_m * triton.cdiv(n, meta["BLOCK_N"])
    return (min(tiles, _sm_count(device)) if meta["PERSISTENT"] else tiles,)


def _replayed(
    key: launches.LaunchKey, tile: tuple[int, ...] | None, stream: int
) -> tuple[tuple[int, ...] | None, int]:
    """The tile and streaming programs recorded for this launch while replaying (a package
    being traced: `launches.replaying`), else the caller's."""
    recorded = launches.replayed(key)
    if recorded is None:
        return tile, stream
    return recorded.sizes(
        "BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"
    ), recorded.stream


def _options(
    act: str,
    bias: torch.Tensor | None,
    x_scale: torch.Tensor,
    quant_a: bool,
    x_inv_divisor: torch.Tensor | None,
    residual: torch.Tensor | None,
    res_act: str,
    pair: torch.Tensor | None,
    mapped: bool,
) -> dict[str, Any]:
    """The kernel's compile-time options that come from the launch's arguments."""
    meta: dict[str, Any] = {"ACT": ACT_CODES[act], "HAS_BIAS": bias is not None, "GROUP_M": 8}
    meta |= {"ROW_SCALE": quant_a or x_scale.numel() > 1}
    meta |= {"QUANT_A": quant_a, "HAS_DIV": x_inv_divisor is not None}
    meta |= {"HAS_RES": residual is not None, "RES_ACT": ACT_CODES[res_act]}
    meta |= {"PAIR": pair is not None, "MAP_OUT": mapped}
    return meta


def _descriptor(t: torch.Tensor, on: bool) -> Any:
    """A tensor descriptor of `t` where `on`, else None. Its block shape is a placeholder: the
    autotuner's pre-hook (or the fixed tile) sets the real one (`set_block_shapes`)."""
    return TensorDescriptor.from_tensor(t, [16, 16]) if on else None


def _promotion(k: int, promote: int) -> int:
    """K within one promotion: the whole sum is one tensor-core chain from zero whatever the
    tile (the same bits), so the K loop needs no hand-over (0) and every tile depth stays open."""
    return 0 if k <= promote else promote


def _fixed_launch(
    grid: Grid,
    args: Args,
    descs: dict[str, Any],
    meta: dict[str, Any],
    tile: tuple[int, ...],
    stream: int,
    nk: tuple[int, int],
) -> None:
    """Launch the plain kernel with one fixed tile (the CPU tests under Triton's interpreter,
    the benchmarks), checking the tile fits the launch: no autotuner here to prune it."""
    promote, use_loads = meta["PROMOTE"], descs["a_desc"] is not None
    n, k = nk
    if not meta["PERSISTENT"] and meta["SUBTILE"]:
        raise ValueError("a subtiled epilogue needs persistent programs")
    if meta["PERSISTENT"] and (not use_loads or stream):
        raise ValueError("persistent programs load through tensor descriptors, one tile at a time")
    bm, bn, bk, *launch = tile
    if promote and bk > promote:
        raise ValueError(f"BLOCK_K {bk} is more than the {promote} products per promotion")
    if stream and (k > bk or n > bn or use_loads):
        raise ValueError(
            f"a streaming tile holds all of K and N and loads through pointers: {tile}"
        )
    meta = {**meta, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    meta |= {"STREAM": stream > 0, "PER_SM": stream}
    meta |= {"TMA_LOADS": use_loads, "TMA_STORE": descs["c_desc"] is not None}
    if launch:
        meta |= {"num_warps": launch[0], "num_stages": launch[1]}
    set_block_shapes({**descs, **meta})
    launches.launchable(FP8_GEMM.kernel)[grid](*args, **meta)
