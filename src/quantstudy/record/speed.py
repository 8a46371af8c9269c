"""fp16 against FP8 timings, kernel time per group, artifact sizes."""

from __future__ import annotations

from quantstudy.record.base import Section
from quantstudy.record.vocab import CompileMode, KernelGroup


class TimingStats(Section):
    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int


class BatchSpeed(Section):
    batch: int
    fp16_ms: TimingStats
    fp8_ms: TimingStats
    ratio: TimingStats  # x = fp16 / fp8, per round pair
    warnings: list[str]


class KernelGroupTime(Section):
    group: KernelGroup
    time_us: float
    count: int


class KernelBreakdown(Section):
    engine: str
    batch: int
    kernel_count: int
    total_us: float
    groups: list[KernelGroupTime]
    top_kernels: list[tuple[str, float]]  # (name, us) of the largest kernels, for the reader


class IdealSpeed(Section):
    """The limit of one batch size (`speed/ideal.py`): the FP8 engine's x if every selected
    layer, its product and the elementwise work fused into it, ran at its FP8 roofline and the
    rest of the engine took what it took in the fp16 engine (schema 6 on)."""

    batch: int
    peaks: str  # the GPU's peaks used, and where they come from
    layers: int  # selected layers priced (dense convs and linears that ran in the example)
    fp16_products_us: float  # the fp16 engine's kernel time on those layers' products
    fp16_elementwise_us: float  # their bias/activation passes in the fp16 engine, priced
    fp8_roofline_us: float  # the same layers at the FP8 roofline, epilogue included
    fp16_ms: float  # the fp16 engine's median ms per call
    ideal_x: float
    measured_x: float  # the FP8 engine's median x at this batch
    fraction: float  # measured_x / ideal_x


class LayerPrecision(Section):
    """What TensorRT ran one FP8 layer of the recipe in, from the engine's layer information."""

    layer: str  # the study's layer name
    precision: str  # fp8, fp16, fp32, int8, bf16, unknown, or "not found"
    engine_layer: str | None = None  # TensorRT's layer that holds it (fused names joined by +)


class SpeedSection(Section):
    device: str
    meaningful: bool  # False on CPU: timings are not evidence for the decision
    meaningless_reason: str | None = None
    compile_mode: CompileMode
    timed_region: str
    rounds: int
    iters_per_round: int
    warmup: int
    input_buffers: int
    clocks: dict[str, str]
    batches: list[BatchSpeed]
    kernels: list[KernelBreakdown]
    weight_bytes: dict[str, int]
    package_bytes: dict[str, int] | None = None
    ideal: list[IdealSpeed] | None = None  # schema 6 on; None: not computed (see not_run)
    # Schema 6 on: which engines were timed. None: the study's own PyTorch engines; "tensorrt":
    # trtexec's timings brought in by `quantstudy import-trt` (`bridge/trt_import.py`).
    engine: str | None = None
    engine_version: str | None = None  # e.g. the TensorRT version trtexec reported
    layer_precision: list[LayerPrecision] | None = None  # TensorRT: each FP8 layer, per batch 1
