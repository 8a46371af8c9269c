"""The cuBLASLt product as a torch custom op, `quantstudy::lt_linear`, so that an engine of
cuBLASLt layers compiles under torch.compile (Inductor sees an opaque call with a known output,
the fake implementation) and is captured in a CUDA graph like any other kernel.

The op is keyed by its problem, not by a layer: layers of one shape, epilogue and output type
share one `LtMatmul` and its chosen algorithm, and each call points the descriptor at its own
layer's scales and bias before launching (host-side attribute writes, which a captured launch
bakes in). The algorithm is chosen on a problem's first call outside stream capture by timing
the heuristic's first `CANDIDATES` kernels on that call's own operands (`choose`); a first call
inside a capture takes the heuristic's first kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from quantstudy.gpu.timer import time_us
from quantstudy.quant.cublaslt.matmul import LtMatmul
from quantstudy.quant.cublaslt.problem import ChannelScale, LtEpilogue, LtOut, Problem

CANDIDATES = 4
E4M3 = torch.float8_e4m3fn
_MATMULS: dict[tuple[Problem, int], LtMatmul] = {}


def problem_of(
    x8: torch.Tensor,
    w8: torch.Tensor,
    bias: torch.Tensor,
    epilogue: str,
    fast_accum: bool,
    out_fp8: bool,
    alpha_vector: bool,
) -> Problem:
    """The `Problem` one call of the op computes."""
    half = LtOut.BF16 if bias.dtype == torch.bfloat16 else LtOut.FP16
    return Problem(
        m=x8.shape[0],
        n=w8.shape[0],
        k=x8.shape[1],
        epilogue=LtEpilogue(epilogue),
        out=LtOut.FP8 if out_fp8 else half,
        fast_accum=fast_accum,
        half=half,
        channel_scale=ChannelScale.ALPHA_VECTOR if alpha_vector else ChannelScale.NONE,
    )


def _time_us(fn: Callable[[], object]) -> float:
    """A candidate algorithm's time, as the autotuner times a config (`gpu/timer.py`)."""
    return time_us(fn, rep=5, stat="median")


def matmul_for(problem: Problem, device: torch.device) -> LtMatmul:
    """The process's `LtMatmul` of `problem` on `device`, built on first use."""
    key = (problem, device.index or 0)
    if key not in _MATMULS:
        _MATMULS[key] = LtMatmul(problem)
    return _MATMULS[key]


def _lt_linear(
    x8: torch.Tensor,
    w8: torch.Tensor,
    scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor | None,
    d_scale: torch.Tensor | None,
    epilogue: str,
    fast_accum: bool,
    out_fp8: bool,
    alpha_vector: bool,
) -> torch.Tensor:
    """epilogue(x8 w8^T scaled [+ bias] [+ residual]) in the bias's dtype, or in FP8 e4m3 times
    `d_scale` (`out_fp8`). `scale` is the weight's float32 scale (one element), or with
    `alpha_vector` the per-output-feature vector w_scale[n] x_scale (then `x_scale` is unused)."""
    problem = problem_of(x8, w8, bias, epilogue, fast_accum, out_fp8, alpha_vector)
    mm = matmul_for(problem, x8.device)
    out = torch.empty(problem.m, problem.n, device=x8.device, dtype=E4M3 if out_fp8 else bias.dtype)
    mm.bind(scale, x_scale, bias, d_scale)
    if mm.algo is None:
        if torch.cuda.is_current_stream_capturing():
            mm.algo = mm.algorithms(1)[0]
        else:
            mm.choose(_time_us, w8, x8, out, residual, count=CANDIDATES)
    mm.launch(w8, x8, out, residual)
    return out


def _shape(
    x8: torch.Tensor,
    w8: torch.Tensor,
    scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor | None,
    d_scale: torch.Tensor | None,
    epilogue: str,
    fast_accum: bool,
    out_fp8: bool,
    alpha_vector: bool,
) -> torch.Tensor:
    return x8.new_empty((x8.shape[0], w8.shape[0]), dtype=E4M3 if out_fp8 else bias.dtype)


# Registered without the decorator form, whose untyped return would make the functions untyped.
lt_linear = torch.library.custom_op("quantstudy::lt_linear", _lt_linear, mutates_args=())
lt_linear.register_fake(_shape)
