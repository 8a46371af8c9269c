"""Device check of the FP8 write's division (`quant/kernels/epilogue.py: scaled_down`): whether
the reciprocal-and-correction form gives IEEE division's quotient, bit for bit, before any
kernel takes it.

Every finite and infinite fp16 value (the inputs of an fp16 engine's FP8 write, rounded to fp16
first) and as many random float32 bit patterns (an fp32 engine's), each divided by every one of
`--scales` scales drawn log-uniformly over the range amax / 448 takes for fp16 activations
(1e-9 to 150, random mantissas), plus the powers of two. Counts the pairs whose float32
quotient differs and those whose saturated E4M3 byte differs; prints one JSON line, writes it
to --out, exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from quantstudy.quant.kernels.epilogue import scaled_down
from quantstudy.study.environment import collect_environment

BLOCK = 1024


@triton.jit
def _compare(y_ptr, s_ptr, n_y, counts_ptr, BLOCK: tl.constexpr):
    """Program (block of y, one scale): both quotients, their float32 bits and E4M3 bytes."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_y
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    s = tl.load(s_ptr + tl.program_id(1))
    exact = scaled_down(y, s, False)
    fast = scaled_down(y, s, True)
    same = (exact.to(tl.int32, bitcast=True) == fast.to(tl.int32, bitcast=True)) | (
        (exact != exact) & (fast != fast)
    )
    q_exact = tl.minimum(tl.maximum(exact, -448.0), 448.0).to(tl.float8e4nv)
    q_fast = tl.minimum(tl.maximum(fast, -448.0), 448.0).to(tl.float8e4nv)
    byte_same = q_exact.to(tl.uint8, bitcast=True) == q_fast.to(tl.uint8, bitcast=True)
    tl.atomic_add(counts_ptr, tl.sum((~same & mask).to(tl.int64)))
    tl.atomic_add(counts_ptr + 1, tl.sum((~byte_same & mask).to(tl.int64)))


def check(y: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    counts = torch.zeros(2, dtype=torch.int64, device="cuda")
    grid = (triton.cdiv(y.numel(), BLOCK), scales.numel())
    _compare[grid](y, scales, y.numel(), counts, BLOCK=BLOCK)
    quotient, byte = counts.tolist()
    return quotient, byte


def inputs(
    n_scales: int, seed: int, n_floats: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scales, every fp16 value, random float32 values) on the GPU: `n_scales` log-uniform over
    1e-9 to 150 beside the powers of two 2^-30 to 2^7; the fp16 values with the infinities,
    without NaN; `n_floats` finite float32 bit patterns at most (default: as many as fp16
    values)."""
    g = torch.Generator().manual_seed(seed)
    exponents = torch.empty(n_scales).uniform_(-9.0, 2.2, generator=g)
    scales = (10.0**exponents).to(torch.float32)
    scales = torch.cat([scales, 2.0 ** torch.arange(-30, 8, dtype=torch.float32)]).cuda()
    halves = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    halves = halves[~torch.isnan(halves)].float().cuda()
    n = halves.numel() if n_floats is None else n_floats
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64)
    floats = bits.to(torch.int32).view(torch.float32)
    return scales, halves, floats[torch.isfinite(floats)].cuda()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, default=4096)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    scales, halves, floats = inputs(args.scales, seed=0)
    result = {"scales": scales.numel(), "pairs": {}, "differ": {}}
    for name, y in (("fp16 values", halves), ("random float32", floats)):
        quotient, byte = check(y, scales)
        result["pairs"][name] = y.numel() * scales.numel()
        result["differ"][name] = {"float32 quotient": quotient, "e4m3 byte": byte}
    result["environment"] = collect_environment(torch.device("cuda")).model_dump()
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return int(any(v for d in result["differ"].values() for v in d.values()))


if __name__ == "__main__":
    sys.exit(main())
