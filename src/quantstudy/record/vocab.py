"""Every closed vocabulary of quantstudy, defined once.

CLI choices, config validation, record fields and report ordering are all derived from these
enums (`choices(E)`, `list(E)`), so adding a member is one line here. They are `StrEnum`s: a
member compares equal to its string and is written to JSON as that string, so records written
before the enums existed load unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class Device(StrEnum):
    """Where a study's engines run (`--device`)."""

    CPU = "cpu"
    CUDA = "cuda"


class CompileMode(StrEnum):
    """How the fp16 and FP8 engines are compiled (our names; `torch_mode` maps to torch's)."""

    DEFAULT = "default"
    MAX_AUTOTUNE = "max-autotune"

    @property
    def torch_mode(self) -> str | None:
        """`torch.compile`'s mode. CUDA graphs are the speed harness's job (it captures the
        call itself), so torch's own cudagraph-wrapping variant is never asked for."""
        return {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}[self.value]


class Fp8Kernel(StrEnum):
    """The product a real FP8 layer runs (`--fp8-kernel`)."""

    FUSED = "fused"  # one Triton kernel: FP8 product, scale, bias, absorbed activation
    SCALED_MM = "scaled_mm"  # torch._scaled_mm, then a separate cast/bias pass
    # per layer the faster of the two, timed in place at build (`engines/kernel_choice.py`)
    FASTEST = "fastest"


class Fp8Path(StrEnum):
    """How a selected layer's FP8 arithmetic is carried out."""

    REAL = "real"  # a real FP8 matrix product
    EMULATED = "emulated"  # no FP8 kernel for the op: quantize-dequantize, computed in fp16


class KernelGroup(StrEnum):
    """Kernel-time groups of the profiler breakdown, in report order."""

    FP8_MATMUL = "fp8_matmul"
    FP16_MATMUL_CONV = "fp16_matmul_conv"
    DEPTHWISE_CONV = "depthwise_conv"
    QUANTIZE_CONVERT = "quantize_convert"
    OTHER = "other"


def choices(enum: type[StrEnum]) -> list[str]:
    """The members' strings, in definition order: argparse `choices=`, error messages."""
    return [m.value for m in enum]
