"""Per-layer kernel choice (`engines/kernel_choice.py`) on CPU, with a stand-in timer."""

import json

import torch
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.engines.kernel_choice import choose_kernels
from quantstudy.quant.apply import QuantPlan
from quantstudy.quant.calibrate import calibrate
from quantstudy.quant.fused import FusedFP8Matmul
from quantstudy.quant.fused_conv import FusedFP8Conv2d
from quantstudy.quant.modules import FP8Matmul

CPU = torch.device("cpu")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k3 = nn.Conv2d(3, 16, 3, padding=1)
        self.pw = nn.Conv2d(16, 32, 1)
        self.act = nn.ReLU()
        self.proj = nn.Conv2d(32, 16, 1)
        self.fc1 = nn.Linear(16, 64)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        k = self.k3(x)
        z = self.act(self.pw(k))
        x = self.proj(z) + k + z[:, :16]  # two readers each: no FP8 hand-off around pw
        return self.fc2(self.gelu(self.fc1(x.mean((2, 3)))))


def _setup():
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 8, 8)
    layers = ["k3", "pw", "proj", "fc1", "fc2"]
    return model, x, QuantPlan(layers, True, calibrate(model, layers, [x]))


def test_off_cuda_nothing_is_timed_and_every_layer_stays_fused():
    model, x, plan = _setup()
    engine = build_fp8(model, CPU, x, plan, dtype=torch.float32, kernel="fastest")
    info = engine.info()
    assert info.fp8_kernel == "fastest"
    assert [(c.name, c.kernel, c.why) for c in info.fp8_kernel_choice] == [
        (n, "fused", "not timed off CUDA") for n in plan.layers
    ]


def test_faster_scaled_mm_replaces_the_fused_layer_with_its_activation_after(tmp_path):
    """Stand-in times: per timed layer the shared input quantize, the fused forward, then the
    unfused one; the quantize is subtracted from both. `pw` (ReLU absorbed) loses to scaled_mm
    by 50%, `proj` by 1% (inside the margin: stays fused);
    the MLP pair hands FP8 over, the 3x3 conv has no unfused kernel: neither is timed. The
    swapped engine computes what the fused one did."""
    model, x, plan = _setup()
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32, kernel="fused").eager
    with torch.no_grad():
        want = m(x)
    times = iter([2.0, 12.0, 7.0, 3.0, 13.0, 12.9])
    cache = tmp_path / "choice.json"
    got = choose_kernels(m, model, plan, torch.float32, x, CPU, 4, cache, lambda fn: next(times))
    by_name = {c.name: c for c in got}
    assert by_name["pw"].kernel == "scaled_mm" and by_name["pw"].batch == 4
    assert (by_name["pw"].fused_us, by_name["pw"].scaled_mm_us) == (10.0, 5.0)
    assert by_name["proj"].kernel == "fused"
    assert (by_name["proj"].fused_us, by_name["proj"].scaled_mm_us) == (10.0, 9.9)
    assert by_name["k3"].why == "no unfused kernel (kxk conv)"
    assert by_name["fc1"].why == by_name["fc2"].why == "FP8 hand-off"
    assert isinstance(m.pw, nn.Sequential) and isinstance(m.pw[0], FP8Matmul)
    assert isinstance(m.pw[1], nn.ReLU)
    assert isinstance(m.proj, FusedFP8Matmul) and isinstance(m.k3, FusedFP8Conv2d)
    with torch.no_grad():
        assert torch.allclose(m(x), want, rtol=1e-5, atol=1e-6)
    assert len(json.loads(cache.read_text())) == 2
    # a rebuilt engine reads the cache: the timer is not called again
    m2 = build_fp8(model, CPU, x, plan, dtype=torch.float32, kernel="fused").eager
    again = choose_kernels(m2, model, plan, torch.float32, x, CPU, 4, cache, lambda fn: 1 / 0)
    assert again == got
