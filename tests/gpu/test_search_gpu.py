"""Per-layer fp16/FP8 timing on a real GPU (skipped without CUDA)."""

import pytest
import torch
from torch import nn

from quantstudy.search.layer_speed import measure_layer_speed


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.pw = nn.Conv2d(64, 256, 1)
        self.dw = nn.Conv2d(256, 256, 3, padding=1, groups=256)
        self.fc = nn.Linear(256, 1000)

    def forward(self, x):
        x = self.dw(self.pw(self.stem(x)).relu())
        return self.fc(x.mean((2, 3)))


# The fused kernel runs every layer here as real FP8: the stem through the kxk conv kernel
# (`quant/layers/fused_conv.py`), the depthwise conv through `quant/layers/fused_depthwise.py`;
# torch._scaled_mm has no conv kernel, so with it both convs stay emulated.
EMULATED = {"fused": set(), "scaled_mm": {"stem", "dw"}}


@pytest.mark.parametrize("kernel", ["fused", "scaled_mm"])
def test_layer_speed_on_gpu(kernel):
    torch.manual_seed(0)
    layers = ["stem", "pw", "dw", "fc"]
    table = measure_layer_speed(
        Net().eval(), torch.zeros(1, 3, 56, 56), layers, batch=32, rounds=6, iters=10, warmup=2,
        kernel=kernel,
    )  # fmt: skip
    assert table.source == "measured" and table.meaningful and table.batch == 32
    rows = {r.layer: r for r in table.layers}
    assert set(rows) == set(layers)
    paths = {name: "emulated" if name in EMULATED[kernel] else "real" for name in layers}
    assert {r.layer: r.fp8_path for r in table.layers} == paths
    assert rows["pw"].input_shape == [32, 64, 56, 56] and rows["fc"].input_shape == [32, 256]
    for r in table.layers:
        assert r.fp16_ms.median > 0 and r.fp8_ms.median > 0 and r.ratio.n == 6
        assert r.saved_ms == r.fp16_ms.median - r.fp8_ms.median
    assert [r.rank for r in table.layers] == [1, 2, 3, 4]
    assert [r.saved_ms for r in table.layers] == sorted(
        (r.saved_ms for r in table.layers), reverse=True
    )
