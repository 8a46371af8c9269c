"""Per-layer kernel choice on CUDA: timed in place, and the chosen engine computes what the
fused one does with the same layers kept in fp16, bit for bit (K is 32 and 96 here, within one
promotion interval, so the FP8 products of both kernels sum alike whether the engines promote or
sum fast: docs/fp8-kernel.md, "The per-layer kernel choice")."""

import json

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.engines.unfused import Unfused
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import KernelChoice

pytestmark = pytest.mark.gpu


class _Net(nn.Module):
    """A thin 1x1 conv (where the fused kernel won on the H200) and a wide linear (where
    cuBLASLt did), neither handing FP8 over."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(32, 96, 1)
        self.act = nn.ReLU6()
        self.fc = nn.Linear(96, 1536)

    def forward(self, x):
        z = self.act(self.pw(x))
        return self.fc((z + z.mean((2, 3), keepdim=True)).mean((2, 3)))


def _engines(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(8, 32, 28, 28)
    plan = QuantPlan(["pw", "fc"], True, calibrate(model, ["pw", "fc"], [x]))
    cuda = torch.device("cuda")
    fused = build_fp8(model, cuda, x[:1], plan, kernel="fused")
    xin = x.cuda().half().contiguous(memory_format=torch.channels_last)
    return model, plan, fused, xin, x[:1]


def test_fastest_engine_times_every_layer_and_matches_the_fused_one(tmp_path, monkeypatch):
    model, plan, fused, xin, example = _engines(tmp_path, monkeypatch)
    cuda = torch.device("cuda")
    fastest = build_fp8(model, cuda, example, plan, kernel=KernelChoice.timed([64]))
    choice = fastest.info().layout.kernel_choice
    assert [c.name for c in choice] == ["pw", "fc"]
    # timed (the shared input quantize subtracted, so a tiny product may read 0)
    assert all(c.fused_us >= 0 and c.scaled_mm_us >= 0 and c.batch == 64 for c in choice)
    assert all(c.fp16_us > 0 for c in choice)  # the float layer, which has no quantize to subtract
    assert (tmp_path / "fp8_kernel_choice.json").is_file()
    stepped = fastest.info().layout.stepped_aside
    if stepped:  # layers kept in fp16 compute other numbers: the fused engine keeps them too
        kept = [c for c in choice if c.kernel == "fp16"]
        fused = build_fp8(model, cuda, example, plan, kernel=KernelChoice.replayed(kept))
    with torch.no_grad():
        a, b = fused.eager(xin).float(), fastest.eager(xin).float()
    assert torch.equal(a, b), (a - b).abs().max()  # whatever FP8 kernel was chosen


@pytest.mark.xfail(
    strict=True,
    reason="measured on the H200 (tests/gpu/records/gpu-suite-7d58091.json): the mixed engine "
    "moved 0.0002 of the outputs by at most 2.4e-4, so 'changes no number' is withdrawn "
    "(docs/fp8-kernel.md); strict, so the day it holds this fails and is noticed",
)
def test_a_mixed_choice_runs_both_kernels_and_changes_no_number(tmp_path, monkeypatch):
    """Timing decides the mix, so the stored timings are rewritten to force one: the 1x1 conv
    keeps the fused kernel, the linear takes torch._scaled_mm. The engine built from them must
    hold both kinds of layer and write exactly the fused engine's numbers."""
    model, plan, fused, xin, example = _engines(tmp_path, monkeypatch)
    cuda = torch.device("cuda")
    build_fp8(model, cuda, example, plan, kernel=KernelChoice.timed([64]))  # stores timings
    cache = tmp_path / "fp8_kernel_choice.json"
    stored = json.loads(cache.read_text())
    assert stored, "no timings stored"
    for key in stored:
        conv = len(json.loads(key)[1]) == 4  # the input shape: NCHW for pw, (N, C) for fc
        fused_us, mm_us = (1.0, 100.0) if conv else (100.0, 1.0)
        stored[key] = {"fused": fused_us, "scaled_mm": mm_us, "fp16": 1000.0}  # fp16 loses
    cache.write_text(json.dumps(stored))
    mixed = build_fp8(model, cuda, example, plan, kernel=KernelChoice.timed([64]))
    kernels = {c.name: str(c.kernel) for c in mixed.info().layout.kernel_choice}
    assert kernels == {"pw": "fused", "fc": "scaled_mm"}
    layers = dict(mixed.eager.named_modules())
    assert isinstance(layers["fc"], Unfused) and not isinstance(layers["pw"], Unfused)
    with torch.no_grad():
        a, b = fused.eager(xin).float(), mixed.eager(xin).float()
    assert torch.equal(a, b), f"{(a != b).float().mean():.4f} differ, worst {(a - b).abs().max()}"


def test_a_layer_whose_float_layer_wins_steps_aside_on_cuda(tmp_path, monkeypatch):
    """The stored timings are rewritten so that the linear's float layer beats both FP8 kernels:
    the rebuilt engine runs it as an fp16 `nn.Linear` (cuBLAS) with the 1x1 conv still FP8, and
    computes what the fused engine with that layer stepped aside computes, bit for bit."""
    model, plan, _, xin, example = _engines(tmp_path, monkeypatch)
    cuda = torch.device("cuda")
    build_fp8(model, cuda, example, plan, kernel=KernelChoice.timed([64]))  # stores timings
    cache = tmp_path / "fp8_kernel_choice.json"
    stored = json.loads(cache.read_text())
    for key in stored:
        conv = len(json.loads(key)[1]) == 4
        stored[key] = {"fused": 10.0, "scaled_mm": 20.0, "fp16": 100.0 if conv else 1.0}
    cache.write_text(json.dumps(stored))
    fastest = build_fp8(model, cuda, example, plan, kernel=KernelChoice.timed([64]))
    info = fastest.info()
    assert info.layout.stepped_aside == ["fc"] and info.fp8_real == ["pw"]
    fc = fastest.eager.fc
    assert isinstance(fc, Unfused) and type(fc.layer) is nn.Linear
    assert fc.layer.weight.dtype == torch.float16
    kept = [c for c in info.layout.kernel_choice if c.kernel == "fp16"]  # fc's, alone
    reference = build_fp8(model, cuda, example, plan, kernel=KernelChoice.replayed(kept))
    with torch.no_grad():
        assert torch.equal(reference.eager(xin), fastest.eager(xin))
