"""The epilogue arithmetic every FP8 kernel shares: activations, FP8 saturation, rounding.

The fused product, the k x k convolution and the depthwise convolution all end the same way;
one definition keeps their outputs bit-equal to the unfused engine's in the same places.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from quantstudy.env.switches import GELU_ERF
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Activation

# The erf of GELU's epilogue (lab switch QUANTSTUDY_GELU_ERF): "exact" is libdevice's erff, as
# torch's nn.GELU computes it, so the engine matches its emulation bit for bit; "approx" is
# `gelu_erf_approx`, to time before it becomes an option (docs/fp8-kernel.md, "GELU's erf").
GELU_ERF_FORMS = ("exact", "approx")
# Kernel-only activation code of GELU through `gelu_erf_approx`. Not an `Activation`: a layer's
# record names what it computes, and this is GELU to within the FP8 rounding; it stands past the
# `Activation` codes so that no new member takes it.
GELU_ERF_APPROX = 64
_GELU_ERF_APPROX = tl.constexpr(GELU_ERF_APPROX)


def gelu_erf_form(environ: Mapping[str, str] = os.environ) -> str:
    """The switch's form of GELU's erf ("exact" where unset); another value is one clear line."""
    form = environ.get(GELU_ERF) or "exact"
    if form not in GELU_ERF_FORMS:
        raise UserError(f"{GELU_ERF}={form!r}: give one of {', '.join(GELU_ERF_FORMS)}")
    return form


# Activation codes of the epilogue; `quant.layers.fused_matmul.ACTIVATIONS` maps modules to them.
# Read at import, as the switch is set for a whole process (a bench run and its record).
ACT_CODES: dict[str, int] = {act: code for code, act in enumerate(Activation)}
if gelu_erf_form() == "approx":
    ACT_CODES[Activation.GELU] = GELU_ERF_APPROX

# P(a) ~ log2 Phi(-a) on [0, 5.5], Phi the standard normal CDF, highest power first: the float32
# minimax fit of `tools/lab/gelu_erf_fit.py` (degree 7, max error 4.6e-6 in log2, a relative
# error of 3.2e-6 in Phi(-a)). Past 5.5 it keeps falling, so GELU goes on to -0 there.
GELU_LOG2_PHI = (
    -1.79345272e-06, 6.09041235e-05, -0.000926028646, 0.00849375594,
    -0.0539378449, -0.458480507, -1.15124679, -0.99999553,
)  # fmt: skip
_P7, _P6, _P5, _P4, _P3, _P2, _P1, _P0 = (tl.constexpr(c) for c in GELU_LOG2_PHI)


@triton.jit
def activation(y, ACT: tl.constexpr):
    """The epilogue's activation (`ACT_CODES`), in float32; shared with
    `quant/kernels/depthwise.py`."""
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
    elif ACT == _GELU_ERF_APPROX:
        y = gelu_erf_approx(y)
    return y


@triton.jit
def gelu_erf_approx(x):
    """GELU(x) = x Phi(x) with h = Phi(-|x|) = 2^P(|x|) (`GELU_LOG2_PHI`): Phi(x) is h below
    zero and 1 - h above: one exp2, seven FMAs, a select and no division or branch (libdevice's
    erff picks one of two coefficient sets, branches to its exp, and GELU adds three operations
    around it). Fitting the lower tail keeps h's relative accuracy where 1 + erf(x / sqrt 2)
    cancels (x below -3). The FP8 codes it leads to are checked against float64 erf-GELU's
    (`tests/unit/test_gelu_erf.py`). Past the fit's range h falls to 0 (-0 out); +-inf and NaN
    come out as the exact form's do."""
    a = tl.abs(x)
    p = _P7 * a + _P6
    p = p * a + _P5
    p = p * a + _P4
    p = p * a + _P3
    p = p * a + _P2
    p = p * a + _P1
    p = p * a + _P0
    h = tl.math.exp2(p)
    return x * tl.where(x < 0.0, h, 1.0 - h)


@triton.jit
def fp8_range(y, out_scale_ptr):
    """`quant.formats.fp8.to_fp8` up to its cast: divide by the scale, saturate at +-448 (E4M3's
    largest value); the caller's store rounds to nearest even. Shared with
    `quant/kernels/depthwise.py`."""
    y = scaled_down(y, tl.load(out_scale_ptr), True)
    return tl.minimum(tl.maximum(y, -448.0), 448.0)


@triton.jit
def scaled_down(y, s, FMA: tl.constexpr):
    """y / s as torch's division rounds it. IEEE division per value (`/` is approximate on the
    GPU) is a slow path in every FP8-writing product; with FMA the scale's reciprocal is taken
    once and each value gets a product and one Markstein correction (two FMAs): the same float32
    quotient for every fp16 input (what an fp16 engine's FP8 write divides), and the same E4M3
    byte after saturation for float32 ones (the check and its cost: docs/fp8-kernel.md, "The FP8
    write's division"). Infinite or NaN remainders (overflow, infinite y) keep the product, an
    exact one keeps its sign; a scale whose reciprocal overflows takes the division."""
    if FMA:
        r = tl.math.div_rn(1.0, s)
        if tl.abs(r) < float("inf"):
            q = y * r
            e = tl.math.fma(-q, s, y)  # the exact remainder y - q s
            fix = (tl.abs(e) > 0.0) & (tl.abs(e) < float("inf"))
            y = tl.where(fix, tl.math.fma(e, r, q), q)
        else:
            y = tl.math.div_rn(y, s)
    else:
        y = tl.math.div_rn(y, s)
    return y


# The engine dtype the epilogue rounds through (`rounded`): none (float32), fp16, bf16.
ROUND_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def rounded(y, ROUND: tl.constexpr):
    """y rounded (to nearest even) to the engine's dtype and back to float32."""
    if ROUND == 1:
        y = y.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
    elif ROUND == 2:
        y = y.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    return y


# Triton 3.6's interpreter (torch 2.11's Triton) holds every scalar as a 1-element array, which
# `range` cannot take as a bound or step (numpy refuses int() of a 1-d array; Triton 3.8 squeezes
# it). No Triton op yields a 0-d array there, hence the interpreter-only branch of `loop_bound`; its
# result goes straight into `range` (the interpreter turns every assigned value back to a tensor).
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def loop_bound(n):
    """A loop bound or step that `range` takes: `n` itself when compiled (the constexpr branch
    is not generated), a Python int of the interpreter's 1-element array when interpreted."""
    if _INTERPRETED:
        return int(n.handle.data.item())
    return n
