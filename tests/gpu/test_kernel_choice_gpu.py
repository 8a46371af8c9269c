"""Per-layer kernel choice on CUDA: timed in place, and the chosen engine computes what the
fused one does (both products promote every 128 products, so they round alike)."""

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.plan.apply import QuantPlan

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


def test_fastest_engine_times_every_layer_and_matches_the_fused_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(8, 32, 28, 28)
    plan = QuantPlan(["pw", "fc"], True, calibrate(model, ["pw", "fc"], [x]))
    cuda = torch.device("cuda")
    fused = build_fp8(model, cuda, x[:1], plan, kernel="fused")
    fastest = build_fp8(model, cuda, x[:1], plan, kernel="fastest", choice_batches=[64])
    choice = fastest.info().fp8_kernel_choice
    assert [c.name for c in choice] == ["pw", "fc"]
    # timed (the shared input quantize subtracted, so a tiny product may read 0)
    assert all(c.fused_us >= 0 and c.scaled_mm_us >= 0 and c.batch == 64 for c in choice)
    assert (tmp_path / "fp8_kernel_choice.json").is_file()
    xin = x.cuda().half().contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        a, b = fused.eager(xin).float(), fastest.eager(xin).float()
    assert torch.allclose(a, b, rtol=2e-3, atol=2e-3), (a - b).abs().max()
