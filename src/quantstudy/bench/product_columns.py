"""The columns a product is timed in beside ours (`products.py`): cuBLASLt with and without
fast accumulation, cuBLASLt followed by each engine epilogue as one Inductor kernel, and each
registered backend that has a bench label, with the epilogues its kernel computes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from quantstudy.bench.product_row import CUBLASLT, CUBLASLT_FAST
from quantstudy.quant.formats.fp8 import to_fp8
from quantstudy.quant.layers.fused_matmul import act_reference
from quantstudy.record.vocab import Activation, Epilogue

# (label, activation, FP8 output) of the engine epilogues timed beside the plain one, all
# rounding to fp16 where the unfused engine stores
EPILOGUES = (
    ("fp16-rounds", Activation.NONE, False),
    ("with-gelu", Activation.GELU, False),
    ("fp8-out", Activation.NONE, True),
    ("with-gelu fp8-out", Activation.GELU, True),
)


def registered_columns(plain: Any) -> dict[str, Callable[[], object]]:
    """The columns of every backend this machine runs that has a `bench_label`
    (`quant/backends/`): its plain product (fp16 out), then each engine epilogue its kernel
    computes (`EPILOGUES`), each a variant of `plain` (a `Product`: fp16 out, summing as the
    engines do). The built-in backends have none: their columns are "ours" and cuBLASLt's."""
    from dataclasses import replace

    from quantstudy.quant import backends

    calls: dict[str, Callable[[], object]] = {}
    for name in backends.usable():
        backend = backends.get(name)
        if backend.bench_label is None:
            continue
        takes = backend.support.takes
        for label, act, fp8_out in (("", Activation.NONE, False), *EPILOGUES):
            if (act != Activation.NONE and not takes(Epilogue.ACTIVATION, act)) or (
                fp8_out and not takes(Epilogue.FP8_OUTPUT)
            ):
                continue
            product = replace(
                plain, act=act, out_dtype=torch.float8_e4m3fn if fp8_out else torch.float16,
                out_scale=plain.x_scale if fp8_out else None,
                round_to=torch.float16 if label else None,
            )  # fmt: skip
            column = f"{backend.bench_label} {label}".strip()
            calls[column] = functools.partial(backend.launch, product)
    return calls


def cublaslt_epilogue(
    y16: torch.Tensor, out_scale: torch.Tensor, act: Activation, fp8_out: bool
) -> torch.Tensor:
    """The fused epilogue's steps after its scales and bias (`quant/kernels/gemm_kernel.py:
    _finish`) on cuBLASLt's fp16 product `y16` (which holds them, rounded to fp16): the
    activation in float32, rounded to fp16, then the next layer's FP8 input (`to_fp8`)."""
    y = act_reference(y16.float(), act).to(torch.float16)
    return to_fp8(y, out_scale) if fp8_out else y


@functools.cache
def _compiled_epilogue(act: Activation, fp8_out: bool) -> Callable[..., torch.Tensor]:
    """`cublaslt_epilogue` as one Inductor kernel, compiled once for every shape. Compiled as an
    engine is: Inductor keeps the fused steps in float32 and drops the activation's rounding to
    fp16, so the FP8 write rounds once where the eager steps and the fused kernel round twice
    (at most about 2^-8 of FP8 outputs, each one step apart: tests/unit/test_bench.py)."""
    return torch.compile(  # type: ignore[no-any-return]
        functools.partial(cublaslt_epilogue, act=act, fp8_out=fp8_out), dynamic=True
    )


def cublaslt_columns(
    a16: torch.Tensor, w16: torch.Tensor, bias: torch.Tensor, fast: bool
) -> dict[str, Callable[[], object]]:
    """`torch._scaled_mm` on the product's shape, per-tensor scales, K and N padded to 16, with
    fast accumulation and without; and, summing as the engines do (`fast`), followed by each
    engine epilogue but the plain rounding (its fp16 out already is)."""
    k, n = a16.shape[1], w16.shape[0]
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    a8 = F.pad(a16, (0, kp - k)).to(torch.float8_e4m3fn)
    w8 = F.pad(w16.mul(64), (0, kp - k, 0, np_ - n)).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=a16.device)
    w_scale = torch.tensor(1 / 64, device=a16.device)
    b16 = F.pad(bias, (0, np_ - n)).half()

    def call(fast: bool) -> Callable[[], object]:
        return lambda: torch._scaled_mm(
            a8, w8.t(), scale_a=one, scale_b=w_scale, bias=b16, out_dtype=torch.float16,
            use_fast_accum=fast,
        )  # fmt: skip

    calls = {CUBLASLT: call(False), CUBLASLT_FAST: call(True)}
    for label, act, fp8_out in EPILOGUES[1:]:
        calls[f"{CUBLASLT} + Inductor {label}"] = _then(
            call(fast), _compiled_epilogue(act, fp8_out), one
        )
    return calls


def _then(
    product: Callable[[], object], epilogue: Callable[..., torch.Tensor], scale: torch.Tensor
) -> Callable[[], object]:
    """One call: the product, then the epilogue on its output."""
    return lambda: epilogue(product(), scale)
