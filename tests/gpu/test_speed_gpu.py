"""The speed harness on a CUDA GPU (skipped elsewhere): timing, kernel groups, package, clocks.

Two tiny compiled engines stand in for the real ones: an fp16 conv net, and the same net with its
1x1 convolution run as a real FP8 matrix product (torch._scaled_mm, per-tensor scales), which needs
compute capability 8.9 or newer.
"""

import math
import shutil

import pytest
import torch
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.engines.interleaved import time_interleaved
from quantstudy.engines.size import package_bytes, weight_bytes
from quantstudy.record import EngineInfo
from quantstudy.speed.clocks import gpu_clocks
from quantstudy.speed.harness import measure_speed

pytestmark = pytest.mark.gpu

FP8_MAX = 448.0


def has_fp8() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


class FP8Pointwise(nn.Module):
    """A 1x1 convolution as an FP8 matrix product over channels-last pixels."""

    def __init__(self, conv: nn.Conv2d, act_amax: float):
        super().__init__()
        w = conv.weight.detach().flatten(1).float()  # (out, in)
        w_scale = w.abs().amax() / FP8_MAX
        self.register_buffer("wq", (w / w_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
        self.register_buffer("w_scale", w_scale.reshape(()))
        self.register_buffer("x_scale", torch.tensor(act_amax / FP8_MAX, device=w.device))
        self.register_buffer("bias", conv.bias.detach().half())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        pixels = x.permute(0, 2, 3, 1).reshape(-1, c)
        xq = (pixels / self.x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            xq, self.wq.t(), scale_a=self.x_scale, scale_b=self.w_scale, out_dtype=torch.float16
        )
        y = y + self.bias
        return y.reshape(b, h, w, -1).permute(0, 3, 1, 2)


class CompiledEngine(Engine):
    def __init__(self, name: str, module: nn.Module):
        self.name = name
        self.device = torch.device("cuda")
        self.dtype = torch.float16
        self.channels_last = True
        self.eager = module
        self.module = torch.compile(module, dynamic=False)

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            compute_dtype="float16",
            device="cuda",
            compiled=True,
            compile_mode="default",
            channels_last=True,
            fp8_real=[],
            fp8_emulated=[],
            fp16_layers=0,
            weight_bytes=weight_bytes(self.eager),
            numerics={},
        )


def fp16_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 16),
    )


def engines(images: torch.Tensor) -> tuple[CompiledEngine, CompiledEngine]:
    fp16 = fp16_net().cuda().half().eval().to(memory_format=torch.channels_last)
    with torch.no_grad():
        x = images.cuda().half().contiguous(memory_format=torch.channels_last)
        act_amax = float(fp16[1](fp16[0](x)).abs().amax())
    fp8 = nn.Sequential(*fp16_net().cuda().half().eval().to(memory_format=torch.channels_last))
    fp8[2] = FP8Pointwise(fp8[2], act_amax)
    return CompiledEngine("fp16", fp16), CompiledEngine("fp8", fp8)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.rand(6, 3, 32, 32)


def test_graph_timing_sees_twice_the_work():
    """B does exactly two of A's matrix products: the per-pair ratio A/B must be near 0.5."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    times = time_interleaved(
        {"one": lambda: a @ b, "two": lambda: (a @ b, b @ a)}, rounds=10, iters=10, warmup=3
    )
    ratios = sorted(x / y for x, y in zip(times["one"], times["two"], strict=True))
    assert 0.4 < ratios[len(ratios) // 2] < 0.6, times


@pytest.mark.skipif(not has_fp8(), reason="FP8 matrix products need compute capability >= 8.9")
def test_measure_speed_times_and_groups_kernels(images):
    fp16, fp8 = engines(images)
    section = measure_speed(
        {"fp16": fp16, "fp8": fp8}, images, [1, 8], rounds=12, iters=10, warmup=3,
        compile_mode="default",
    )["fp8"]  # fmt: skip
    assert section.meaningful and section.meaningless_reason is None
    assert "CUDA graph replay" in section.timed_region
    assert section.input_buffers >= 1
    for speed in section.batches:
        for stats in (speed.fp16_ms, speed.fp8_ms, speed.ratio):
            assert stats.n == 12
            assert math.isfinite(stats.median) and stats.median > 0
            assert stats.min <= stats.q1 <= stats.median <= stats.q3 <= stats.max
    assert [(k.engine, k.batch) for k in section.kernels] == [
        ("fp16", 1),
        ("fp8", 1),
        ("fp16", 8),
        ("fp8", 8),
    ]
    for k in section.kernels:
        groups = {g.group: g for g in k.groups}
        assert k.kernel_count > 0 and k.total_us > 0
        assert sum(g.time_us for g in k.groups) == pytest.approx(k.total_us)
        assert sum(g.count for g in k.groups) == k.kernel_count
        if k.engine == "fp8":
            assert groups["fp8_matmul"].count >= 1, k.top_kernels
            assert groups["quantize_convert"].count >= 1, k.top_kernels
        else:
            assert groups["fp8_matmul"].count == 0, k.top_kernels
            assert groups["quantize_convert"].count == 0, k.top_kernels
            assert groups["fp16_matmul_conv"].count >= 1, k.top_kernels
    assert section.weight_bytes["fp8"] < section.weight_bytes["fp16"]
    if shutil.which("nvidia-smi"):
        assert "clocks.sm (start)" in section.clocks and "clocks.sm (end)" in section.clocks


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not installed")
def test_gpu_clocks_match_the_torch_device():
    clocks = gpu_clocks(torch.device("cuda", 0))
    assert clocks["name"] == torch.cuda.get_device_name(0)
    assert clocks["gpu_match"].startswith("nvidia-smi --id=GPU-")
    assert clocks["clocks.sm"].endswith("MHz")


def test_package_bytes_of_a_tiny_fp16_net(tmp_path):
    net = fp16_net().cuda().half().eval()
    x = torch.rand(1, 3, 32, 32, device="cuda", dtype=torch.float16)
    size = package_bytes(net, x, tmp_path / "net.pt2")
    assert (tmp_path / "net.pt2").stat().st_size == size
    assert size > weight_bytes(net)  # the package holds the weights and the compiled code
