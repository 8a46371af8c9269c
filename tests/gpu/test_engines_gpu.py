"""The compiled FP8 engine on CUDA: real FP8 kernels, and outputs close to the emulation."""

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fakequant, build_fp8, build_half
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.build_spec import BuildSpec
from quantstudy.speed.kernels import profile_kernels


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.pw1 = nn.Conv2d(64, 128, 1)
        self.dw = nn.Conv2d(128, 128, 3, padding=1, groups=128)
        self.pw2 = nn.Conv2d(128, 64, 1)
        self.fc = nn.Linear(64, 32)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.dw(torch.relu(self.pw1(x))))
        x = self.pw2(x).mean((2, 3))
        return self.fc(x)


@pytest.mark.parametrize("kernel", ["fused", "scaled_mm"])
def test_fp8_engine_on_cuda_runs_fp8_kernels_and_matches_emulation(kernel):
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(32, 3, 32, 32)
    layers = ["pw1", "dw", "pw2", "fc"]
    plan = QuantPlan(layers, True, calibrate(m, layers, [x]))
    cuda = torch.device("cuda")
    fp8 = build_fp8(m, cuda, x[:1], plan, spec=BuildSpec(kernel=kernel))
    assert fp8.info().layout.kernel == kernel
    # the fused kernel runs the depthwise conv as a real FP8 kernel
    # (`quant/layers/fused_depthwise.py`); torch._scaled_mm has no conv, so there it stays emulated
    if kernel == "fused":
        assert sorted(fp8.applied.real) == ["dw", "fc", "pw1", "pw2"]
        assert fp8.applied.emulated == []
    else:
        assert sorted(fp8.applied.real) == ["fc", "pw1", "pw2"]
        assert [name for name, _ in fp8.applied.emulated] == ["dw"]
    assert fp8.compiled
    out = fp8(x)
    ref = build_fakequant(m, torch.device("cpu"), x[:1], plan)(x)
    assert torch.linalg.norm(out - ref) / torch.linalg.norm(ref) < 2e-2
    kernels = profile_kernels(fp8, x, 32)
    groups = {g.group: g.count for g in kernels.groups}
    assert groups["fp8_matmul"] >= 3, kernels.top_kernels
    half = build_half(m, cuda, x[:1])
    assert half.info().compute_dtype == "float16"


class Mlp(nn.Module):
    """Tokens through fc1 -> GELU -> fc2: the fused engine hands fc1's output to fc2 in FP8."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(256, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        t = x.flatten(2).transpose(1, 2)
        t = t + self.fc2(self.act(self.fc1(t)))
        return self.head(t.mean(1))


class ConvFFN(nn.Module):
    """pw expand -> ReLU -> pw project with a residual: a conv-to-conv hand-off, channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.pw_exp = nn.Conv2d(64, 256, 1)
        self.act = nn.ReLU()
        self.pw_proj = nn.Conv2d(256, 64, 1)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = x + self.pw_proj(self.act(self.pw_exp(x)))
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize(
    "net,shape,layers,handoff",
    [
        (Mlp, (16, 64, 7, 7), ["fc1", "fc2", "head"], {"fc1": "fc2"}),
        (ConvFFN, (16, 64, 14, 14), ["pw_exp", "pw_proj", "head"], {"pw_exp": "pw_proj"}),
    ],
    ids=["linear", "conv"],
)
def test_fp8_handoff_on_cuda_matches_the_emulation(net, shape, layers, handoff):
    torch.manual_seed(0)
    m = net().eval()
    x = torch.randn(shape)
    plan = QuantPlan(layers, True, calibrate(m, layers, [x]))
    fp8 = build_fp8(m, torch.device("cuda"), x[:1], plan, spec=BuildSpec(kernel="fused"))
    assert fp8.info().layout.handoff == handoff
    out = fp8(x)
    ref = build_fakequant(m, torch.device("cpu"), x[:1], plan)(x)
    assert torch.linalg.norm(out - ref) / torch.linalg.norm(ref) < 2e-2
