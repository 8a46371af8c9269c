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


class Accumulation(StrEnum):
    """How the FP8 products sum (`record/build_spec.py`): in float32 every 128 products, as
    cuBLASLt without fast accumulation (the fused and unfused engines then write the same
    bits), or all of K in the tensor cores, as torchao's float8 configs do by default."""

    PROMOTE128 = "promote128"
    FAST = "fast"


# `--fp8-kernel`'s one option that names no backend (`quant/backends/`): each real layer's
# backend chosen by timing (`record/engines.py: KernelChoice`; kept in records before schema 18
# as an engine's kernel).
FASTEST = "fastest"


class ProductOp(StrEnum):
    """A layer an FP8 product backend may run (`quant/backends/`), by its shape as a product."""

    LINEAR = "linear"
    CONV1X1 = "conv1x1"  # a dense 1x1 conv, any stride, no padding: a product over pixels
    CONV_KXK = "conv_kxk"  # a dense kxk conv, as an implicit GEMM
    DEPTHWISE = "depthwise"  # one channel per group


class Epilogue(StrEnum):
    """What an FP8 product backend may do beside the product, in its own kernel."""

    BIAS = "bias"
    ACTIVATION = "activation"  # one of `Activation`, after the bias (`Support.activations`)
    RESIDUAL = "residual"  # a residual sum added after the activation
    FP8_OUTPUT = "fp8_output"  # the next layer's FP8 input, with its scale (a hand-off)
    FP8_PAIR = "fp8_pair"  # the output and its FP8 copy, from one epilogue (a sum hand-off)
    PADDED_OUTPUT = "padded_output"  # written inside the next conv's zero padding


class Activation(StrEnum):
    """An activation an FP8 layer's epilogue computes; the definition order is the kernels'
    activation code (`quant/kernels/epilogue.py`), so a new member goes last."""

    NONE = "none"
    RELU = "relu"
    RELU6 = "relu6"
    SILU = "silu"
    HARDSWISH = "hardswish"
    GELU = "gelu"  # exact (erf), not the tanh approximation


class GeluForm(StrEnum):
    """Which GELU a layer computes: timm's `nn.GELU` is erf; cuBLASLt's GELU epilogue is the
    tanh approximation (`quant/cublaslt/problem.py`). Both engine and emulation compute the
    form the layer's record names (`FP8Layout.gelu`)."""

    ERF = "erf"
    TANH = "tanh"


class GeluPolicy(StrEnum):
    """Which GELU forms a recipe lets an FP8 layer compute (the recipe's `gelu:`)."""

    ANY = "any"  # a backend may run its own form (cuBLASLt's tanh); the record names it
    ERF = "erf"  # erf only: a GELU epilogue of another form is not taken


class Engine(StrEnum):
    """The engines and emulations a study runs, by the name records and reports give them."""

    FP32 = "fp32"  # the reference
    FP16 = "fp16"
    FP8 = "fp8"
    FAKEQUANT = "fakequant"  # the recipe's FP8 arithmetic emulated in fp32
    FAKEQUANT_WEIGHTS = "fakequant_weights"  # weights only
    FAKEQUANT_ACTIVATIONS = "fakequant_activations"  # activations only


class FP8Path(StrEnum):
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


class Outcome(StrEnum):
    """What a decision says (`quantstudy run` exits 0, 3 and 4 on them, in this order)."""

    SHIP = "ship"
    NOT_SHIP = "not_ship"  # a gate's whole interval is on the bad side
    INCONCLUSIVE = "inconclusive"  # no gate fails, but one cannot yet say pass


class RowStatus(StrEnum):
    """Where one study of a sweep or the zoo stands (`sweep/study_row.py`), in counting order."""

    COMPLETE = "complete"
    FAILED = "failed"  # the study stopped on an error (its one line is the row's error)
    INTERRUPTED = "interrupted"  # stopped by the sweep; a rerun resumes it
    PARTIAL = "partial"  # the process finished but the record is not complete
    PENDING = "pending"  # not run yet
    # zoo only: the model's recipe selects no layer, so FP8 has nothing to speed up; the row
    # shows the x of a recipe that does select layers (`zoo/answers.py`)
    NO_LAYER = "no_layer"


class GateStatus(StrEnum):
    """One gate's verdict: where its interval lies against its threshold."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class StopReason(StrEnum):
    """Why a sequential study (`--heldout auto`) stopped taking held-out images."""

    SETTLED = "settled"  # every quality gate passed or failed
    NO_EVIDENCE = "no_evidence"  # every open gate lacks evidence more images cannot bring
    DATA_EXHAUSTED = "data_exhausted"  # the held-out folder ran out first
    UPPER_BOUND = "upper_bound"  # the study's image limit was reached first


class GateKind(StrEnum):
    SPEED = "speed"
    QUALITY = "quality"


class GateMetric(StrEnum):
    """What a gate's value measures (its unit follows)."""

    SPEEDUP = "speedup"  # x = fp16 ms / FP8 ms per timing round
    TOP1_CHANGE = "top1_change"  # FP8 top-1 - baseline top-1, a fraction
    AGREEMENT = "agreement"  # share of images whose top-1 equals the baseline's
    KL_MEAN = "kl_mean"  # mean KL(baseline || FP8), nats
    NONFINITE = "nonfinite"  # count of NaN/Inf outputs


class Baseline(StrEnum):
    """The engine a quality gate compares FP8 with."""

    FP32 = "fp32"  # the reference
    FP16 = "fp16"  # the engine FP8 would replace


class Direction(StrEnum):
    """The good side of a gate's threshold."""

    AT_LEAST = "at_least"
    AT_MOST = "at_most"


class Missing(StrEnum):
    """Why a gate has no evaluation; the report's "when to revisit" groups gates by it."""

    NOT_ON_GPU = "not_on_gpu"  # timings taken, but not on a GPU
    NOT_TIMED = "not_timed"  # no timing of this batch or compile mode
    NOT_MEASURED = "not_measured"  # the section or engine is absent
    RANDOM_WEIGHTS = "random_weights"  # quality of an untrained network is not evidence
    NOT_MEANINGFUL = "not_meaningful"  # quality marked not meaningful for another reason
    UNLABELLED = "unlabelled"  # no labels: top-1 cannot be measured
    NOT_RECORDED = "not_recorded"  # the record predates the numbers this gate needs


def choices(enum: type[StrEnum]) -> list[str]:
    """The members' strings, in definition order: argparse `choices=`, error messages."""
    return [m.value for m in enum]


class Calibrator(StrEnum):
    """How a static activation scale is found from the calibration images (`quant/calibrators`)."""

    MAX = "max"
    PERCENTILE = "percentile"
    MSE = "mse"
    ENTROPY = "entropy"


class WeightGranularity(StrEnum):
    PER_CHANNEL = "per_channel"
    PER_TENSOR = "per_tensor"


class Rounding(StrEnum):
    """How FP8 weights are rounded (`quant/fitting/rounding.py`)."""

    NEAREST = "nearest"
    COMPENSATING = "compensating"


class Tuning(StrEnum):
    """What end-to-end output tuning trains against the fp32 logits (`quant/fitting/tune.py`)."""

    NONE = "none"
    BIAS = "bias"  # each selected layer's bias
    SCALE_BIAS = "scale_bias"  # and each output channel's gain, folded into its weight scale


class ActivationGranularity(StrEnum):
    PER_TENSOR = "per_tensor"  # one static scale per tensor, from a calibrator
    PER_ROW = "per_row"  # one scale per row, computed at run time


class Migration(StrEnum):
    """Range migration between an FP8 layer's input channels and its weights."""

    NONE = "none"
    SMOOTH = "smooth"


class PeerProvider(StrEnum):
    """Who built an engine of `quantstudy bench peers` (`bench/peers/`): its provider. (A
    family is a model's, `recipe/family.py`.)"""

    FP16 = "fp16"  # the study's fp16 engine: the baseline of every x
    QUANTSTUDY = "quantstudy"  # our FP8 engine
    TORCHAO = "torchao"  # one of torchao's float8 inference configs
