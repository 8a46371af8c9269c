"""The cuBLASLt backend's pure parts on the CPU: the header's numbers, the TN layout mapping,
the epilogue a layer asks for, shape refusals, and the one-line answer without CUDA."""

from __future__ import annotations

import pytest

from quantstudy.quant.cublaslt import abi
from quantstudy.quant.cublaslt.problem import LtEpilogue, LtOut, Problem, epilogue_for
from quantstudy.record.vocab import Activation


def test_the_header_numbers_are_cublasLt_h_s() -> None:
    # cublasLt.h / library_types.h (CUDA 12 and 13), as nvmath-python's cycublasLt.pxd spells them
    assert (abi.R_32F, abi.R_16F, abi.R_16BF, abi.R_8F_E4M3) == (0, 2, 14, 28)
    assert abi.COMPUTE_32F == 68
    assert (abi.DESC_TRANSA, abi.DESC_TRANSB, abi.DESC_EPILOGUE, abi.DESC_BIAS_POINTER) == (
        3,
        4,
        7,
        8,
    )
    assert (abi.DESC_A_SCALE_POINTER, abi.DESC_B_SCALE_POINTER, abi.DESC_D_SCALE_POINTER) == (
        17,
        18,
        20,
    )
    assert (abi.DESC_FAST_ACCUM, abi.DESC_BIAS_DATA_TYPE, abi.DESC_EPILOGUE_AUX_DATA_TYPE) == (
        25,
        26,
        22,
    )
    assert abi.EPILOGUE_GELU_BIAS == abi.EPILOGUE_GELU | abi.EPILOGUE_BIAS
    assert abi.EPILOGUE_GELU_AUX_BIAS == abi.EPILOGUE_GELU | 128 | abi.EPILOGUE_BIAS
    assert abi.EPILOGUE_RELU_BIAS == abi.EPILOGUE_RELU | abi.EPILOGUE_BIAS
    assert abi.HEURISTIC_RESULT_BYTES == 8 * 8 + 8 + 4 + 4 + 4 * 4


def test_the_weight_takes_the_a_slot_and_d_is_the_row_major_output() -> None:
    p = Problem(m=197, n=3072, k=768, epilogue=LtEpilogue.GELU_BIAS, out=LtOut.FP8, fast_accum=True)
    lay = p.layouts()
    # column-major (rows, cols, ld, type): W (N, K) row-major is (K, N) column-major, ld K
    assert lay["a"] == (768, 3072, 768, abi.R_8F_E4M3)
    assert lay["b"] == (768, 197, 768, abi.R_8F_E4M3)
    # D^T column-major (N, M), ld N: the bytes of a row-major (M, N) output
    assert lay["d"] == (3072, 197, 3072, abi.R_8F_E4M3)
    assert lay["c"] == (3072, 197, 3072, abi.R_16F)  # C and the bias stay 16-bit
    assert p.epilogue_code == abi.EPILOGUE_GELU_BIAS
    assert p.beta == 0.0


def test_the_residual_is_c_with_beta_one() -> None:
    p = Problem(768, 768, 768, LtEpilogue.BIAS_RESIDUAL, LtOut.FP16, True)
    assert p.beta == 1.0
    assert p.epilogue_code == abi.EPILOGUE_BIAS
    assert p.has_bias


@pytest.mark.parametrize(
    ("m", "n", "k", "out", "says"),
    [
        (197, 768, 760, LtOut.FP16, "K = 760"),
        (197, 1001, 768, LtOut.FP16, "N = 1001"),
        (197, 1000, 768, LtOut.FP8, "N = 1000"),  # 1000 bytes: not 16-byte rows
        (0, 768, 768, LtOut.FP16, "empty"),
    ],
)
def test_shapes_cuBLASLt_cannot_take_are_refused_with_the_reason(
    m: int, n: int, k: int, out: LtOut, says: str
) -> None:
    reason = Problem(m, n, k, LtEpilogue.BIAS, out, True).refusal()
    assert reason is not None and says in reason


def test_aligned_shapes_are_taken_whatever_m() -> None:
    assert Problem(197, 1000, 768, LtEpilogue.BIAS, LtOut.FP16, True).refusal() is None
    assert Problem(1, 2304, 768, LtEpilogue.NONE, LtOut.FP8, False).refusal() is None


@pytest.mark.parametrize(
    ("bias", "act", "residual", "fp8_out", "want"),
    [
        (True, Activation.NONE, False, False, LtEpilogue.BIAS),  # qkv
        (False, "none", False, False, LtEpilogue.BIAS),  # a zero bias
        (True, "none", True, False, LtEpilogue.BIAS_RESIDUAL),  # proj, fc2
        (True, "gelu", False, True, LtEpilogue.GELU_BIAS),  # fc1, FP8 out for fc2
        (True, "relu", False, False, LtEpilogue.RELU_BIAS),
        (True, "silu", False, False, None),
        (True, "hardswish", False, False, None),
        (True, "relu", True, False, None),  # an activation after the residual sum
        (True, "none", True, True, None),  # two outputs
    ],
)
def test_each_layer_gets_the_epilogue_its_fused_form_computes(
    bias: bool, act: str, residual: bool, fp8_out: bool, want: LtEpilogue | None
) -> None:
    got, reason = epilogue_for(bias, act, residual, fp8_out)
    assert got == want
    assert reason  # a reason either way: what it runs, or why cuBLASLt cannot


def test_with_erf_required_gelu_is_declined_with_why_and_the_rest_taken() -> None:
    assert epilogue_for(True, "gelu", False, True, erf_only=True) == (
        None,
        "the recipe requires erf GELU; cuBLASLt's is the tanh form",
    )
    assert epilogue_for(True, "relu", False, False, erf_only=True)[0] == LtEpilogue.RELU_BIAS
    assert epilogue_for(True, "none", True, False, erf_only=True)[0] == LtEpilogue.BIAS_RESIDUAL


def test_without_cuda_the_backend_is_unavailable_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from quantstudy.quant.cublaslt import library

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    why = library.unavailable()
    assert why is not None and "\n" not in why and "CUDA" in why
