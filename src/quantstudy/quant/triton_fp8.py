"""The fused FP8 matrix product as a Triton kernel: FP8 operands, float32 accumulation, epilogue.

y[m, n] = act(acc[m, n] * x_scale * w_scale[n] + bias[n]), acc = sum_k xq[m, k] * w8[n, k],
written once in the engine's dtype. cuBLASLt's FP8 kernel (torch._scaled_mm) writes bf16 and
needs a row-wise activation scale tensor of M elements plus a separate pass for the activation;
here the per-channel scale, folded-BatchNorm bias and activation ride in the epilogue, the
activation scale is read from device memory (no host sync, no M-sized tensor), and any K and N
work (masked loads: no zero padding to multiples of 16).

Imported lazily: Triton ships with CUDA builds of torch only.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Activation codes of the epilogue; `quant.fused.ACTIVATIONS` maps modules to them.
ACT_CODES = {"none": 0, "relu": 1, "relu6": 2, "silu": 3, "hardswish": 4, "gelu": 5}

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): tall tiles for the large-M, thin-channel 1x1 convs
# of batch-128 CNNs, square ones for the compute-bound layers, small ones for batch 1.
CONFIGS = [
    (128, 64, 32, 4, 4),
    (128, 128, 32, 8, 3),
    (128, 32, 64, 4, 4),
    (256, 64, 32, 8, 3),
    (64, 64, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (64, 128, 128, 4, 3),
    (64, 32, 64, 4, 4),
    (32, 64, 128, 4, 3),
]

# Tiles of the tensor-descriptor kernel (Hopper): the copy engine keeps more stages in flight
# with fewer registers, so deeper pipelines and larger K steps pay.
TMA_CONFIGS = [
    (128, 64, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 32, 128, 4, 4),
    (64, 64, 128, 4, 4),
    (128, 128, 128, 8, 3),
    (128, 256, 64, 8, 3),
    (64, 128, 128, 4, 3),
    (64, 32, 128, 4, 4),
]


def _prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem: they only waste the autotuner's time."""
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    keep = [
        c
        for c in configs
        if c.kwargs["BLOCK_N"] <= max(32, triton.next_power_of_2(n))
        and c.kwargs["BLOCK_K"] <= max(32, triton.next_power_of_2(k))
        and c.kwargs["BLOCK_M"] <= max(32, triton.next_power_of_2(m))
    ]
    return keep or configs[:1]


def _bench(fn, quantiles=None):
    # Short autotuning runs: tens of shapes per engine, each picked once per process.
    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


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
def _epilogue(
    acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, w_scale_ptr, x_scale_ptr, bias_ptr,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Scales, bias and activation on the float32 sums; one masked store in the output dtype."""
    n_mask = offs_n < N
    scale = tl.load(w_scale_ptr + offs_n, mask=n_mask, other=0.0) * tl.load(x_scale_ptr)
    y = acc * scale[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
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
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & n_mask[None, :])


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, w_scale_ptr, x_scale_ptr, bias_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Pointer loads, masked on every edge: any strides, any K and N."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_n[None, :] < N) & (offs_k[:, None] < k_left), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    _epilogue(
        acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, w_scale_ptr, x_scale_ptr,
        bias_ptr, ACT, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _fp8_gemm_kernel_tma(
    a_desc, b_desc, c_ptr, w_scale_ptr, x_scale_ptr, bias_ptr,
    M, N, K, stride_cm, stride_cn,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Tensor-descriptor loads (Hopper's copy engine): no address arithmetic or masks in the
    loop; tiles past an edge arrive zero-filled, so they add nothing to the sums."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k0 * BLOCK_K])
        b = b_desc.load([off_n, k0 * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    _epilogue(
        acc, offs_m, offs_n, M, N, c_ptr, stride_cm, stride_cn, w_scale_ptr, x_scale_ptr,
        bias_ptr, ACT, HAS_BIAS,
    )  # fmt: skip


# The autotuned kernels (CUDA). The plain ones stay callable with one fixed tile, which is how
# the CPU tests run them under TRITON_INTERPRET=1 (the autotuner needs a GPU to time configs).
def _configs(tiles, pre_hook=None):
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
            num_warps=w,
            num_stages=s,
            pre_hook=pre_hook,
        )
        for bm, bn, bk, w, s in tiles
    ]


def _set_block_shapes(nargs) -> None:
    """Give the descriptors the tile of the config about to run (descriptors carry it)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]


_TUNING = {
    "key": ["M", "N", "K", "ACT", "HAS_BIAS"],
    "prune_configs_by": {"early_config_prune": _prune},
    "do_bench": _bench,
}
_fp8_gemm_tuned = triton.autotune(configs=_configs(CONFIGS), **_TUNING)(_fp8_gemm_kernel)
_fp8_gemm_tma_tuned = triton.autotune(configs=_configs(TMA_CONFIGS, _set_block_shapes), **_TUNING)(
    _fp8_gemm_kernel_tma
)

LOADS = ("auto", "pointer", "tma")


def tma_ok(xq: torch.Tensor, w8: torch.Tensor) -> bool:
    """Whether both operands can be read through tensor descriptors: a Hopper or newer GPU (or
    the interpreter), unit last stride, 16-byte aligned base and row strides."""
    if xq.is_cuda and torch.cuda.get_device_capability(xq.device)[0] < 9:
        return False
    if not xq.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return all(
        t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (xq, w8)
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
    loads: str = "auto",
) -> torch.Tensor:
    """Launch the kernel: xq (M, K) and w8 (N, K) in FP8 E4M3, w_scale (N,) and bias (N,)
    float32, x_scale a float32 scalar tensor; returns (M, N) in `out_dtype`. `tile`
    (BLOCK_M, BLOCK_N, BLOCK_K[, warps, stages]) skips the autotuner. `loads` "auto" reads
    through tensor descriptors where `tma_ok`, else through pointers."""
    if loads not in LOADS:
        raise ValueError(f"loads must be one of {LOADS}, got {loads!r}")
    m, k = xq.shape
    n = w8.shape[0]
    out = torch.empty((m, n), device=xq.device, dtype=out_dtype)
    if m == 0:
        return out
    use_tma = loads == "tma" or (loads == "auto" and tma_ok(xq, w8))

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    epilogue = (out, w_scale, x_scale, bias if bias is not None else w_scale)
    meta = {"ACT": ACT_CODES[act], "HAS_BIAS": bias is not None, "GROUP_M": 8}
    if tile is not None:
        bm, bn, bk, *launch = tile
        meta |= {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        if launch:
            meta |= {"num_warps": launch[0], "num_stages": launch[1]}
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # Placeholder tiles; the autotuner's pre-hook (or the fixed tile) sets the real ones.
        bm, bn, bk = (meta.get(key, 32) for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        a_desc = TensorDescriptor.from_tensor(xq, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(w8, [bn, bk])
        args = (a_desc, b_desc, *epilogue, m, n, k, out.stride(0), out.stride(1))
        kernel = _fp8_gemm_kernel_tma if tile is not None else _fp8_gemm_tma_tuned
    else:
        args = (
            xq, w8, *epilogue, m, n, k,
            xq.stride(0), xq.stride(1), w8.stride(0), w8.stride(1), out.stride(0), out.stride(1),
        )  # fmt: skip
        kernel = _fp8_gemm_kernel if tile is not None else _fp8_gemm_tuned
    kernel[grid](*args, **meta)
    return out
