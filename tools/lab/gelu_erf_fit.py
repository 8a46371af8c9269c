"""The coefficients of the epilogue's approximate erf-GELU (`quant/kernels/epilogue.py:
GELU_LOG2_PHI`): a polynomial P(a) ~ log2 Phi(-a) on [0, A], Phi the standard normal CDF.

GELU(x) = x Phi(x), and with h = 2^P(|x|) the kernel takes Phi(x) = h for x < 0 and 1 - h
otherwise: one exp2, a polynomial and no division. The fit is the lower tail's logarithm, not erf
itself, so h keeps its relative accuracy however small it is (1 + erf(x / sqrt 2) in float32
loses it to cancellation below x = -3) and the GELU of a very negative x is exact to a few ulps.
The fit minimises the largest absolute error in log2 (Lawson's iteration on a weighted
least-squares Chebyshev fit), then rounds the coefficients to float32 one at a time from the
highest, refitting the rest after each, so the rounding costs no accuracy. Past A the polynomial
must keep falling (the script checks it): h then keeps shrinking and the GELU of x < -A goes to
-0, as exact erf's float32 GELU does (an odd degree whose top coefficient comes out positive
turns back up and fails this).

Run with scipy installed, no GPU:  python tools/lab/gelu_erf_fit.py [--degree 7 --top 5.5]
"""

from __future__ import annotations

import argparse

import numpy as np
from numpy.polynomial import chebyshev, polynomial
from scipy.special import log_ndtr


def log2_phi_lower(a: np.ndarray) -> np.ndarray:
    """log2 Phi(-a), accurate in float64 however small Phi(-a) is."""
    log2: np.ndarray = log_ndtr(-a) / np.log(2.0)
    return log2


def _fit(top: float, degree: int, fixed: list[float], nodes: int = 3000) -> list[float]:
    """Monomial coefficients (highest first) of the minimax fit with the leading `fixed` ones
    given: Lawson's reweighting of a least-squares fit in the Chebyshev basis of [0, top]."""
    a = (np.cos(np.linspace(0.0, np.pi, nodes)) + 1.0) * top / 2
    target = log2_phi_lower(a) - sum(c * a ** (degree - i) for i, c in enumerate(fixed))
    basis = chebyshev.chebvander(2 * a / top - 1, degree - len(fixed))
    weight = np.full(nodes, 1.0 / nodes)
    for _ in range(300):
        root = np.sqrt(weight)
        coef = np.linalg.lstsq(basis * root[:, None], target * root, rcond=None)[0]
        weight = weight * np.abs(basis @ coef - target) + 1e-300
        weight /= weight.sum()
    in_t = chebyshev.cheb2poly(coef)  # monomials of t = 2a/top - 1
    in_a = np.zeros(len(in_t))
    power = np.array([1.0])
    for c in in_t:
        in_a[: len(power)] += c * power
        power = polynomial.polymul(power, [-1.0, 2.0 / top])
    return fixed + list(in_a[::-1])


def fit(top: float, degree: int) -> list[float]:
    """float32 coefficients, highest first, each rounded after the ones above it."""
    fixed: list[float] = []
    while len(fixed) <= degree:
        fixed.append(float(np.float32(_fit(top, degree, fixed)[len(fixed)])))
    return fixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degree", type=int, default=7)
    parser.add_argument("--top", type=float, default=5.5, help="the fit's range is [0, top]")
    args = parser.parse_args()
    coef = fit(args.top, args.degree)
    a = np.linspace(0.0, args.top, 400001)
    error = np.abs(np.polyval(coef, a) - log2_phi_lower(a)).max()
    past = np.polyval(coef, np.linspace(args.top, 1e4, 1000001))
    print(f"degree {args.degree} on [0, {args.top}]: max |P - log2 Phi(-a)| = {error:.2e}")
    print(f"falls past {args.top}: {bool(np.all(np.diff(past) < 0))}")
    print("(" + ", ".join(f"{c:.9g}" for c in coef) + ")")


if __name__ == "__main__":
    main()
