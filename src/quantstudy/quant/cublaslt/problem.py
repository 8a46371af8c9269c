"""One FP8 product as cuBLASLt sees it, worked out without a GPU: the operand layouts, the
epilogue a layer asks for, and what cuBLASLt needs of the shapes.

The layout is the same for every layer. quantstudy's tensors are row-major: activations x (M, K),
weight w (N, K), output y (M, N). cuBLASLt is column-major and its FP8 kernels on Hopper take
only the "TN" form (A transposed, B not) with both operands K-contiguous. Putting the weight in
the A slot (a column-major (K, N) matrix, transposed) and the activations in the B slot (column-
major (K, M), not transposed) gives D = W X^T, a column-major (N, M) matrix: byte for byte the
row-major (M, N) output. It also makes cuBLASLt's bias, which runs along D's rows, a bias per
output feature, and keeps D column-major, which the bias and activation epilogues require.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from quantstudy.quant.cublaslt import abi
from quantstudy.record.vocab import Activation, GeluForm


class LtEpilogue(StrEnum):
    """What cuBLASLt does to a product before writing it."""

    NONE = "none"  # D = s_a s_b (W X^T)
    BIAS = "bias"  # + bias per output feature
    RELU_BIAS = "relu+bias"
    BIAS_RESIDUAL = "bias+residual"  # + bias + C, C = the residual stream (beta = 1)
    GELU_BIAS = "gelu+bias"  # GELU (cuBLASLt's is the tanh form) of product + bias
    GELU_AUX_BIAS = "gelu_aux+bias"  # the same, also writing the pre-activation (aux)


class LtOut(StrEnum):
    """D's type: the engine's 16-bit dtype, or FP8 e4m3 scaled for the next FP8 layer."""

    FP16 = "float16"  # torch's dtype names, as `Support.out_dtypes` spells them
    BF16 = "bfloat16"
    FP8 = "float8_e4m3fn"


class ChannelScale(StrEnum):
    """How the weight's per-output-feature scales reach cuBLASLt, whose plain FP8 scaling is
    one float per operand: not at all (per-tensor weight scales), as alpha, a device vector
    along D's rows (w_scale[n] x_scale, folded at build: the input scale is static), or as
    A's outer-vector scale mode (one float32 per row of op(A))."""

    NONE = "per-tensor"
    ALPHA_VECTOR = "alpha-vector"
    OUTER_VEC = "outer-vector"


GELU_EPILOGUES = frozenset({LtEpilogue.GELU_BIAS, LtEpilogue.GELU_AUX_BIAS})

# How the backend's note in an engine's record begins (`FP8Layout.scaled_mm_output`, which
# holds every backend's note): the report prints it whole.
LT_NOTE_HEAD = "cuBLASLt ran"

# The GELU each epilogue computes (the cuBLAS documentation of cublasLtEpilogue_t).
GELU_FORM = GeluForm.TANH

_CODES = {
    LtEpilogue.NONE: abi.EPILOGUE_DEFAULT,
    LtEpilogue.BIAS: abi.EPILOGUE_BIAS,
    LtEpilogue.RELU_BIAS: abi.EPILOGUE_RELU_BIAS,
    LtEpilogue.BIAS_RESIDUAL: abi.EPILOGUE_BIAS,
    LtEpilogue.GELU_BIAS: abi.EPILOGUE_GELU_BIAS,
    LtEpilogue.GELU_AUX_BIAS: abi.EPILOGUE_GELU_AUX_BIAS,
}
_TYPES = {LtOut.FP16: abi.R_16F, LtOut.BF16: abi.R_16BF, LtOut.FP8: abi.R_8F_E4M3}

# (rows, columns, leading dimension, cudaDataType) of a column-major matrix
Layout = tuple[int, int, int, int]


@dataclass(frozen=True)
class Problem:
    """One product: x (m, k) FP8 times w (n, k) FP8, with its epilogue and output type. `half`
    is the 16-bit type of the bias and of C: with an FP8 D cuBLASLt wants both 16-bit, and C of
    the engine's dtype (the cuBLAS FP8 type table)."""

    m: int
    n: int
    k: int
    epilogue: LtEpilogue
    out: LtOut
    fast_accum: bool
    half: LtOut = LtOut.FP16
    channel_scale: ChannelScale = ChannelScale.NONE

    @property
    def epilogue_code(self) -> int:
        """cublasLtEpilogue_t of this problem (the residual is C, not an epilogue)."""
        return _CODES[self.epilogue]

    @property
    def has_bias(self) -> bool:
        return self.epilogue is not LtEpilogue.NONE

    @property
    def beta(self) -> float:
        """1 where C is the residual stream, else 0 (C is then never read)."""
        return 1.0 if self.epilogue is LtEpilogue.BIAS_RESIDUAL else 0.0

    def layouts(self) -> dict[str, Layout]:
        """The A, B, C and D layouts of the module docstring's mapping."""
        n, m, k = self.n, self.m, self.k
        half = _TYPES[self.half]
        return {
            "a": (k, n, k, abi.R_8F_E4M3),  # the weight, transposed by TRANSA = T
            "b": (k, m, k, abi.R_8F_E4M3),  # the activations, TRANSB = N
            "c": (n, m, n, half),
            "d": (n, m, n, _TYPES[self.out]),
        }

    def refusal(self) -> str | None:
        """Why cuBLASLt cannot take this problem as it stands, or None: FP8 operands need
        16-byte rows (K a multiple of 16), D's rows 16-byte aligned too."""
        if self.m < 1 or self.n < 1 or self.k < 1:
            return f"empty product {self.m}x{self.n}x{self.k}"
        if self.k % 16:
            return f"K = {self.k} is not a multiple of 16 (FP8 operands need 16-byte rows)"
        row_bytes = self.n * (1 if self.out is LtOut.FP8 else 2)
        if row_bytes % 16:
            return f"N = {self.n}: D's rows of {row_bytes} bytes are not 16-byte aligned"
        if self.half is LtOut.FP8:
            return "the bias and C are 16-bit: half must be fp16 or bf16"
        return None


def epilogue_for(
    bias: bool, activation: Activation, residual: bool, fp8_out: bool, erf_only: bool = False
) -> tuple[LtEpilogue | None, str]:
    """The epilogue a layer asks for, from what its fused form computes: a bias (a layer
    without one passes zeros), an activation, a residual sum after it, an FP8 output for the
    next layer. None with the reason where cuBLASLt has no such epilogue, or where its GELU
    is the tanh form and the recipe requires erf (`erf_only`, the recipe's `gelu: erf`); the
    layer then runs another backend."""
    del bias  # cuBLASLt's bias epilogues take a zero bias as well as any other
    act = Activation(activation)
    if residual and act != Activation.NONE:
        return None, f"an activation ({act}) with the residual sum: cuBLASLt adds C last"
    if residual and fp8_out:
        return None, "a residual sum that is also the next layer's FP8 input needs two outputs"
    if residual:
        return LtEpilogue.BIAS_RESIDUAL, "bias, the residual stream as C"
    if act == Activation.NONE:
        return LtEpilogue.BIAS, "bias"
    if act == Activation.RELU:
        return LtEpilogue.RELU_BIAS, "relu with bias"
    if act == Activation.GELU and erf_only:
        return None, f"the recipe requires erf GELU; cuBLASLt's is the {GELU_FORM} form"
    if act == Activation.GELU:
        return LtEpilogue.GELU_BIAS, f"gelu ({GELU_FORM} form) with bias"
    return None, f"cuBLASLt has no {act} epilogue"
