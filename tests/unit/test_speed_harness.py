"""The timing harness on CPU: round order, input buffers, and the speed section of a tiny engine."""

import math

import pytest
import torch
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.engines.interleaved import time_interleaved
from quantstudy.engines.size import weight_bytes
from quantstudy.record import EngineInfo, SpeedSection
from quantstudy.record.errors import UserError
from quantstudy.speed.harness import (
    CPU_MEANINGLESS_REASON,
    CPU_ROUNDS,
    input_buffer_count,
    measure_speed,
    speed_not_run,
    tile_images,
)

torch.set_num_threads(1)

MB = 1024 * 1024


class Recorder(nn.Module):
    """Wraps a module and records the shape of every input it is called with."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x):
        self.shapes.append(tuple(x.shape))
        return self.inner(x)


class TinyEngine(Engine):
    def __init__(self, name: str, width: int):
        self.name = name
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.channels_last = False
        torch.manual_seed(0)
        self.module = Recorder(
            nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(width, 10),
            )
        ).eval()

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            compute_dtype="float32",
            device="cpu",
            compiled=False,
            fp8_real=[],
            fp8_emulated=[],
            fp16_layers=2,
            weight_bytes=weight_bytes(self.module),
            numerics={},
        )


def test_rounds_alternate_abba_and_variants_rotate():
    calls: list[str] = []
    fns = {
        "a": [lambda: calls.append("a0"), lambda: calls.append("a1")],
        "b": lambda: calls.append("b"),
    }
    times = time_interleaved(fns, rounds=3, iters=3, warmup=1, device="cpu")
    warm = ["a0", "a1", "b"]
    a_round = ["a0", "a1", "a0"]
    b_round = ["b", "b", "b"]
    assert calls == warm + a_round + b_round + b_round + a_round + a_round + b_round
    assert set(times) == {"a", "b"}
    assert all(len(v) == 3 and all(t >= 0 for t in v) for v in times.values())


def test_time_interleaved_rejects_bad_counts():
    with pytest.raises(UserError):
        time_interleaved({"a": lambda: None}, rounds=0, iters=1, warmup=0, device="cpu")
    with pytest.raises(UserError):
        time_interleaved({"a": lambda: None}, rounds=1, iters=0, warmup=0, device="cpu")


@pytest.mark.parametrize(
    ("input_bytes", "l2", "n_images", "batch", "expected"),
    [
        (1 * MB, 60 * MB, 100, 1, 4),  # small input: the cap
        (20 * MB, 60 * MB, 100, 1, 3),  # three fit in L2 together
        (40 * MB, 60 * MB, 1000, 128, 1),  # one fits
        (80 * MB, 60 * MB, 1000, 128, 1),  # none fits: still one buffer
        (1 * MB, 60 * MB, 10, 4, 2),  # only two batches of distinct images
        (1 * MB, None, 100, 1, 1),  # CPU: no rotation
    ],
)
def test_input_buffer_count(input_bytes, l2, n_images, batch, expected):
    assert input_buffer_count(input_bytes, l2, n_images, batch, max_buffers=4) == expected


def test_tile_images_wraps_around():
    images = torch.arange(3, dtype=torch.float32).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    tiled = tile_images(images, 5, offset=2)
    assert tiled[:, 0, 0, 0].tolist() == [2.0, 0.0, 1.0, 2.0, 0.0]
    assert tiled.is_contiguous()


def test_measure_speed_on_cpu_is_marked_not_meaningful():
    fp16, fp8 = TinyEngine("fp16", 4), TinyEngine("fp8", 6)
    images = torch.rand(3, 3, 8, 8)
    sections = measure_speed(
        {"fp16": fp16, "fp8": fp8}, images, [1, 4], rounds=30, compile_mode="default"
    )
    assert list(sections) == ["fp8"]
    section = sections["fp8"]

    assert section.meaningful is False
    assert section.meaningless_reason == CPU_MEANINGLESS_REASON
    assert section.device == "cpu"
    assert section.rounds == CPU_ROUNDS
    assert "perf_counter" in section.timed_region and "no CUDA graphs" in section.timed_region
    assert section.kernels == []
    assert section.clocks == {}
    assert section.input_buffers == 1
    assert section.package_bytes is None
    assert [b.batch for b in section.batches] == [1, 4]
    for speed in section.batches:
        for stats in (speed.fp16_ms, speed.fp8_ms, speed.ratio):
            assert stats.n == CPU_ROUNDS
            assert math.isfinite(stats.median) and stats.median > 0
            assert stats.min <= stats.q1 <= stats.median <= stats.q3 <= stats.max
        assert any("rounds" in w for w in speed.warnings)  # 3 rounds < 10: always warned on CPU

    # Each engine really ran at each batch size (warm-up + rounds x iters calls).
    for engine in (fp16, fp8):
        shapes = engine.module.shapes
        assert (1, 3, 8, 8) in shapes and (4, 3, 8, 8) in shapes
        per_batch = section.warmup + section.rounds * section.iters_per_round
        assert shapes.count((4, 3, 8, 8)) == per_batch

    conv_lin = lambda w: (3 * w * 9 + w + w * 10 + 10) * 4  # noqa: E731
    assert section.weight_bytes == {"fp16": conv_lin(4), "fp8": conv_lin(6)}

    not_run = speed_not_run(section)
    assert any("GPU timing" in line for line in not_run)
    assert any("kernel time per group" in line for line in not_run)

    # The section is a valid, JSON round-tripping record.
    assert SpeedSection.model_validate_json(section.model_dump_json()) == section


def test_measure_speed_checks_its_inputs():
    fp16, fp8 = TinyEngine("fp16", 4), TinyEngine("fp8", 4)
    images = torch.rand(2, 3, 8, 8)
    with pytest.raises(UserError):
        measure_speed({"fp16": fp16, "fp8": fp8}, images, [0], compile_mode="none")
    with pytest.raises(UserError):
        measure_speed({"fp16": fp16, "fp8": fp8}, images, [], compile_mode="none")
    with pytest.raises(ValueError):
        measure_speed(
            {"fp16": fp16, "fp8": TinyEngine("fp16", 4)}, images, [1], compile_mode="none"
        )
    with pytest.raises(ValueError):
        measure_speed({"fp16": fp16, "fp8": fp8}, images.half(), [1], compile_mode="none")
