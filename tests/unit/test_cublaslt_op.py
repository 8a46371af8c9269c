"""The cuBLASLt custom op's fake implementation: what torch.compile and export see of a
cuBLASLt layer without running it (shapes and dtypes), checked on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from quantstudy.quant.cublaslt.op import lt_linear, problem_of
from quantstudy.quant.cublaslt.problem import ChannelScale, LtEpilogue, LtOut

E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize(
    ("epilogue", "out_fp8", "bias_dtype", "want"),
    [
        ("gelu+bias", True, torch.float16, E4M3),
        ("bias", False, torch.float16, torch.float16),
        ("bias+residual", False, torch.bfloat16, torch.bfloat16),
    ],
)
def test_the_fake_gives_the_output_shape_and_dtype(
    epilogue: str, out_fp8: bool, bias_dtype: torch.dtype, want: torch.dtype
) -> None:
    with FakeTensorMode():
        x8 = torch.empty(197, 768, dtype=E4M3)
        w8 = torch.empty(3072, 768, dtype=E4M3)
        scale = torch.empty(1)
        bias = torch.empty(3072, dtype=bias_dtype)
        res = torch.empty(197, 3072, dtype=bias_dtype) if "residual" in epilogue else None
        y = lt_linear(x8, w8, scale, scale, bias, res, scale, epilogue, True, out_fp8, False)
    assert tuple(y.shape) == (197, 3072)
    assert y.dtype == want


def test_a_call_s_problem_is_read_from_its_operands() -> None:
    x8 = torch.empty(394, 768, dtype=E4M3)
    w8 = torch.empty(2304, 768, dtype=E4M3)
    bias = torch.empty(2304, dtype=torch.bfloat16)
    p = problem_of(x8, w8, bias, "bias", False, False, True)
    assert (p.m, p.n, p.k) == (394, 2304, 768)
    assert p.epilogue is LtEpilogue.BIAS and p.out is LtOut.BF16 and p.half is LtOut.BF16
    assert p.channel_scale is ChannelScale.ALPHA_VECTOR and not p.fast_accum
