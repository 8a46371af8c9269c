"""The epilogue's approximate erf-GELU (`quant/kernels/epilogue.py: gelu_erf_approx`) against
float64 erf-GELU after the FP8 write (`tests/gelu_erf_cases.py`): its formula in numpy float32
on the CPU (seven million values) and the epilogue's own jit functions under Triton's
interpreter (1.75 million); at least 99.99% of E4M3 outputs equal, none more than one step off.
The lab switch that puts it in the kernels' epilogue (QUANTSTUDY_GELU_ERF) is read here too.
"""

import os

import numpy as np
import pytest
import torch
from _interpreter import require_triton, run_interpreted

from quantstudy.env.switches import GELU_ERF, LAB_SWITCHES
from quantstudy.record.errors import UserError
from tests.gelu_erf_cases import (
    E4M3_MAX,
    MIN_EQUAL,
    as_e4m3,
    cases,
    fp8_agreement,
    gelu64,
    yardsticks,
)

require_triton()
from quantstudy.quant.kernels import epilogue  # noqa: E402  (needs Triton)


def gelu_approx_f32(x: np.ndarray) -> np.ndarray:
    """`gelu_erf_approx`'s formula in float32, one rounding per operation, as the interpreter
    runs it (the GPU fuses each multiply-add, rounding once)."""
    x = x.astype(np.float32)
    a = np.abs(x)
    coef = [np.float32(c) for c in epilogue.GELU_LOG2_PHI]
    p = coef[0] * a + coef[1]
    for c in coef[2:]:
        p = p * a + c
    h = np.exp2(p)
    return x * np.where(x < 0, h, np.float32(1.0) - h)


def fp8_write(y: np.ndarray, out_scale: float) -> torch.Tensor:
    """`fp8_range` in numpy float32 (one correctly rounded division, saturation), then E4M3."""
    q = np.clip(y / np.float32(out_scale), -E4M3_MAX, E4M3_MAX)
    return as_e4m3(torch.from_numpy(q))


@pytest.mark.parametrize("case", range(7))
def test_the_formula_in_float32_writes_the_fp8_of_float64_erf_gelu(case):
    name, x, out_scale = cases()[case]
    share, far = fp8_agreement(fp8_write(gelu_approx_f32(x.numpy()), out_scale), yardsticks()[case])
    assert share >= MIN_EQUAL, f"{name}: {100 * (1 - share):.4f}% of E4M3 outputs differ"
    assert not far, name


def test_the_formula_keeps_gelus_relative_accuracy_down_the_lower_tail():
    """Relative error of GELU itself, well inside the FP8 bound, over the fit's range and above:
    under 1e-5 from x = -5.5 up (the fit's 3.2e-6 on Phi(-a), plus float32's rounding of a
    polynomial worth up to 20 in log2 there); 1 + erf(x / sqrt 2) in float32 would lose all of
    it by x = -5.5. Below -5.5, past the fit, the error grows but stays under 0.5% down to -8,
    where GELU is 4e-8 or less (5e-15 at -8)."""
    x = torch.linspace(-8.0, 8.0, 400_001)
    want = gelu64(x)
    ratio = torch.from_numpy(gelu_approx_f32(x.numpy())).double() / want
    fit = x >= -5.5
    assert (ratio[fit] - 1).abs().max() < 1e-5
    assert (ratio[~fit] - 1).abs().max() < 5e-3


def test_the_formula_takes_zero_infinities_nan_and_huge_values_as_the_exact_form():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 40.0, -40.0], np.float32)
    t = torch.from_numpy(x)
    exact = (0.5 * t * (1.0 + torch.erf(t * 0.7071067811865476))).numpy()
    with np.errstate(over="ignore", invalid="ignore"):  # the infinities' own arithmetic
        got = gelu_approx_f32(x)
    np.testing.assert_array_equal(got, exact)  # NaN where the exact form's is, -0 for -40
    assert np.signbit(got[[1, 8]]).all()


def test_the_fit_is_in_float32_and_falls_past_its_range():
    """Each coefficient is a float32 (the kernel's constants hold them exactly), and the
    polynomial falls from its range's end on, so GELU of x below -5.5 only shrinks to -0."""
    coef = epilogue.GELU_LOG2_PHI
    assert all(float(np.float32(c)) == np.float32(c) for c in coef)
    p = np.polyval([float(np.float32(c)) for c in coef], np.linspace(5.5, 1e4, 100_001))
    assert (np.diff(p) < 0).all()


def test_the_switch_is_a_lab_switch_and_says_a_bad_value_in_one_line():
    assert GELU_ERF in LAB_SWITCHES
    assert epilogue.gelu_erf_form({}) == "exact"
    assert epilogue.gelu_erf_form({GELU_ERF: "approx"}) == "approx"
    with pytest.raises(UserError, match=f"{GELU_ERF}='tanh': give one of exact, approx"):
        epilogue.gelu_erf_form({GELU_ERF: "tanh"})


def test_the_default_epilogue_runs_the_exact_erf():
    if os.environ.get(GELU_ERF):
        pytest.skip(f"{GELU_ERF} is set in this process")
    assert epilogue.ACT_CODES["gelu"] == 5


# The interpreter runs every STRIDE-th input of each case (1.75 million values in all): its
# rounding is the formula's (checked), so the million per case above need not run through it.
STRIDE = 4


def test_the_epilogue_under_the_interpreter_writes_the_fp8_of_float64_erf_gelu(tmp_path):
    """The switch on, every launch's GELU code is the approximation's; the epilogue's jit
    functions (activation, then fp8_range) run on each case's inputs under the interpreter."""
    out = tmp_path / "gelu.pt"
    (approx_code,) = run_interpreted(
        f"""
        import os
        os.environ["{GELU_ERF}"] = "approx"
        import torch
        from quantstudy.quant.kernels.epilogue import ACT_CODES, GELU_ERF_APPROX
        from tests.gelu_erf_cases import cases
        from tests.gelu_erf_kernel import gelu_write
        assert ACT_CODES["gelu"] == GELU_ERF_APPROX
        act = ACT_CODES["gelu"]
        got = [gelu_write(x[::{STRIDE}], s, act, torch.float32) for _, x, s in cases()]
        x = cases()[3][1][::{STRIDE}]  # N(0, 4): with scale 1 the write's division is exact
        torch.save((got, x, gelu_write(x, 1.0, act, torch.float32)), {str(out)!r})
        print(act)
        """
    )
    assert int(approx_code) == epilogue.GELU_ERF_APPROX
    got, x, gelu = torch.load(out)
    # the kernel's float32 GELU is the formula's, bit for bit (the interpreter rounds as numpy)
    assert np.array_equal(gelu.numpy(), gelu_approx_f32(x.numpy()))
    for (name, _, _), y, want in zip(cases(), got, yardsticks(), strict=True):
        share, far = fp8_agreement(as_e4m3(y), want[::STRIDE])
        assert share >= MIN_EQUAL, f"{name}: {100 * (1 - share):.4f}% of E4M3 outputs differ"
        assert not far, name
