"""The loop pieces every FP8 product kernel shares (the fused product, `gemm_kernel.py`, and
the kxk convolution, `conv.py`): the grouped tile order and one K step of tensor-core sums with
float32 promotion every PROMOTE products.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row-tiles share each weight tile while it is in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def mma_step(a, b, acc, part, step, BLOCK_K: tl.constexpr, PROMOTE: tl.constexpr):
    """One K step: `part` += a @ b in the tensor cores, moved into the float32 `acc` after
    every PROMOTE products (K step `step`, from 0); returns (acc, part), the caller adds the
    last `part`.

    Hopper's FP8 tensor cores align each MMA's products and the running sum to the largest
    exponent and keep about 14 bits, and Triton leaves the whole K loop in them on sm90 unless
    told otherwise; cuBLASLt promotes once per K tile. Only promoting at the same K as
    cuBLASLt (every 128 products, whatever BLOCK_K) makes the kernel write torch._scaled_mm's
    values for every output (tests/gpu/test_fused_gpu.py checks it): both engines must promote
    at the same K, hence PROMOTE. Tiles have BLOCK_K <= PROMOTE or PROMOTE == 0 (`prune_gemm`).
    The price, some speed against Triton's default, is measured in docs/fp8-kernel.md."""
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
