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
