"""The approximate erf-GELU compiled (`quant/kernels/epilogue.py: gelu_erf_approx`): the E4M3
bytes the GPU's epilogue writes (fused multiply-adds, ex2.approx, the store's rounding) against
float64 erf-GELU's, on the CPU test's cases (`tests/gelu_erf_cases.py`, a million values each):
at least 99.99% equal, none more than one E4M3 step off."""

import pytest
import torch

from tests.gelu_erf_cases import MIN_EQUAL, cases, fp8_agreement, yardsticks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.mark.parametrize("case", range(len(cases())))
def test_the_compiled_epilogue_writes_the_fp8_of_float64_erf_gelu(case):
    from quantstudy.quant.kernels.epilogue import GELU_ERF_APPROX
    from tests.gelu_erf_kernel import gelu_write

    name, x, out_scale = cases()[case]
    y = gelu_write(x.cuda(), out_scale, GELU_ERF_APPROX, torch.float8_e4m3fn)
    share, far = fp8_agreement(y.float().cpu(), yardsticks()[case])
    assert share >= MIN_EQUAL, f"{name}: {100 * (1 - share):.4f}% of E4M3 outputs differ"
    assert not far, name
