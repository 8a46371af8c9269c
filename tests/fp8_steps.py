"""One E4M3 step, computed from the exponent of the value: what a test means by "one FP8 step".

E4M3 (`torch.float8_e4m3fn`) keeps 3 mantissa bits: between 2^e and 2^(e+1) its values are
2^(e-3) apart for every normal binade (e >= -6), and the subnormals below 2^-6 are 2^-9 apart.
So two E4M3 values are one step apart when they differ by the spacing at the smaller magnitude;
a bound relative to the larger value (a quarter or an eighth of it) admits two steps below a
power of two and more near zero, which is why the tests use this instead.
"""

from __future__ import annotations

import torch

MIN_NORMAL_EXPONENT = -6  # 2^-6, E4M3's smallest normal value
MANTISSA_BITS = 3
SUBNORMAL_STEP = 2.0 ** (MIN_NORMAL_EXPONENT - MANTISSA_BITS)  # 2^-9


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of E4M3 values at |v|, element by element: 2^(e-3) where 2^e <= |v| < 2^(e+1)
    in the normal range, 2^-9 below it (zero included)."""
    _, exponent = torch.frexp(v.float())  # |v| = mantissa * 2^exponent, mantissa in [0.5, 1)
    binade = (exponent - 1).clamp_min(MIN_NORMAL_EXPONENT)  # floor(log2 |v|), held at 2^-6
    step = torch.exp2((binade - MANTISSA_BITS).float())
    return torch.where(v == 0, torch.full_like(step, SUBNORMAL_STEP), step)


def within_one_e4m3_step(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Where `got` and `want` (E4M3 values, as float) are equal or one E4M3 step apart: their
    difference is at most the spacing at the smaller magnitude, so two values on either side of
    zero, or two steps apart below a power of two, are not."""
    got, want = got.float(), want.float()
    smaller = torch.minimum(got.abs(), want.abs())
    return (got - want).abs() <= e4m3_step(smaller)


def more_than_one_e4m3_step(got: torch.Tensor, want: torch.Tensor) -> str:
    """A failure message naming the first few outputs more than one step apart ("" if none)."""
    bad = ~within_one_e4m3_step(got, want)
    if not bad.any():
        return ""
    return (
        f"{int(bad.sum())} outputs more than one E4M3 step apart: got {got[bad][:8].tolist()}, "
        f"want {want[bad][:8].tolist()}"
    )
