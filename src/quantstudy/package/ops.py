"""The study's FP8 operators as ops AOTInductor compiles into a package.

The study's engine calls its Triton kernels through opaque `custom_op`s (`quant/layers/opdef.py`):
a package of that engine as it stands would call back into quantstudy at run time. Each
operator's declaration also registers its function as a `torch.library.triton_op`, under the
namespace `quantstudy_pkg` with the same schema; `package/graph.py` points the exported graph at
those, and AOTInductor traces into them, finds the kernel launches (`wrap_triton`) and compiles
them into the package.

The packaged ops run the study's own function, so each kernel receives the arguments the study's
engine gave it. What they launch with is decided by the launchers within
`quant.kernels.launches.replaying(record)`: the tile the study's run recorded for that launch,
through pointers (torch's non-Dynamo tracer, the one a `triton_op` goes through, captures no
host-side tensor descriptors in torch 2.11 or 2.14), and the padded product handed its whole
buffer, never a view (`fused_matmul.fp8_gemm_padded` says why). Off CUDA the function is the
op's torch arithmetic (exact FP8 products summed in float32), which AOTInductor compiles for the
CPU: what the CPU tests package.
"""

from __future__ import annotations

from typing import Any

from quantstudy.quant.layers import fused_conv, fused_depthwise, fused_matmul
from quantstudy.quant.layers.opdef import FP8Op

NAMESPACE = "quantstudy_pkg"

# Every FP8 operator a study's engine may call; `package/graph.py` refuses any other.
STUDY_OPS: tuple[FP8Op, ...] = (
    fused_matmul.fp8_gemm,
    fused_matmul.fp8_gemm_pair,
    fused_matmul.fp8_gemm_padded,
    fused_conv.fp8_conv2d,
    fused_depthwise.fp8_depthwise,
)

# The study's op name -> its packaged op (same function, same schema).
PACKAGED: dict[str, Any] = {op.name: op.packaged(NAMESPACE) for op in STUDY_OPS}
