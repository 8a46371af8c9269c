"""The inputs, the float64 yardstick and the FP8 check of the approximate erf-GELU's tests
(`tests/unit/test_gelu_erf.py` on the CPU and under Triton's interpreter,
`tests/gpu/test_gelu_erf_gpu.py` on the GPU). No Triton here, so the CPU test runs without it.

An FP8 layer's epilogue computes GELU in float32 on the product's output, divides by the next
layer's scale, saturates at 448 and rounds to E4M3 (`quant/kernels/epilogue.py: fp8_range`).
The yardstick is the same write of float64 erf-GELU, rounded once, exactly, to E4M3. The bound:
at least 99.99% of outputs equal, none more than one E4M3 step off (`tests/fp8_steps.py`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from tests.fp8_steps import more_than_one_e4m3_step

E4M3_MAX = 448.0
MIN_EQUAL = 0.9999  # the share of FP8 outputs that must equal the yardstick's
SIGMAS = (0.5, 1.0, 2.0, 4.0)


def gelu64(x: torch.Tensor) -> torch.Tensor:
    """erf-GELU in float64 through erfc, which keeps its relative accuracy in the lower tail
    (1 + erf cancels there even in float64)."""
    x = x.double()
    return 0.5 * x * torch.special.erfc(-x / math.sqrt(2.0))


def out_scale_to_max(x: torch.Tensor) -> float:
    """The float32 scale that maps the largest |GELU| of `x` to 448, as calibration sets it."""
    return float(np.float32(gelu64(x).abs().max().item() / E4M3_MAX))


@functools.cache
def cases(n: int = 1_000_000) -> list[tuple[str, torch.Tensor, float]]:
    """(name, float32 inputs, the FP8 write's scale): normal inputs of each of `SIGMAS` and a
    grid over [-12, 12], each scaled so its largest GELU is 448; the lower tail alone, scaled so
    too and at 1e-4, which brings GELU of x in [-5, -2] into E4M3's normal range (where the tail's
    relative accuracy shows). Made once per process; callers do not change them."""
    g = torch.Generator().manual_seed(0)
    made = [(f"N(0, {s})", torch.randn(n, generator=g) * s) for s in SIGMAS]
    made.append(("grid [-12, 12]", torch.linspace(-12.0, 12.0, n)))
    tail = torch.rand(n, generator=g) * -8.0
    made.append(("U(-8, 0)", tail))
    out = [(name, x, out_scale_to_max(x)) for name, x in made]
    return [*out, ("U(-8, 0), scale 1e-4", tail, float(np.float32(1e-4)))]


def e4m3_exact(v: torch.Tensor) -> torch.Tensor:
    """float64 values saturated at +-448 and rounded once to the nearest E4M3 value (ties to
    even), as float32: no float32 rounding in between."""
    a = np.minimum(np.abs(v.numpy()), E4M3_MAX)
    with np.errstate(divide="ignore"):
        binade = np.maximum(np.floor(np.log2(a)), -6.0)  # subnormals share 2^-6's spacing
    step = np.exp2(binade - 3.0)
    return torch.from_numpy(np.copysign(np.round(a / step) * step, v.numpy())).float()


def yardstick(x: torch.Tensor, out_scale: float) -> torch.Tensor:
    """The FP8 write of float64 erf-GELU of `x` (float32) with `out_scale`, as float32 values."""
    return e4m3_exact(gelu64(x) / out_scale)


@functools.cache
def yardsticks() -> list[torch.Tensor]:
    """`yardstick` of each of `cases()`, made once per process."""
    return [yardstick(x, out_scale) for _, x, out_scale in cases()]


def as_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Float32 values already divided and saturated (what `fp8_range` returns), rounded to E4M3
    as the kernel's store rounds them, back as float32."""
    return y.float().to(torch.float8_e4m3fn).float()


def fp8_agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[float, str]:
    """The share of equal E4M3 outputs (+0 and -0 alike) and a message naming those more than
    one step apart ("" if none)."""
    return float((got == want).double().mean()), more_than_one_e4m3_step(got, want)
