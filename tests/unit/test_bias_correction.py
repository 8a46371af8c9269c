"""Weight bias correction: the shift it removes is exactly the mean FP8 weight-rounding error."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.engines.builders import build_fakequant, build_fp8
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.fitting.bias_correction import correct_biases, output_shift
from quantstudy.quant.formats.fp8 import dequantize_weight, quantize_weight
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.build_spec import BuildSpec

CPU = torch.device("cpu")


def _quantized_copy(layer: nn.Module) -> nn.Module:
    """The layer with its weights rounded to FP8 and back, as the engines' FP8 weights are."""
    q = copy.deepcopy(layer)
    w8, scale = quantize_weight(layer.weight.detach(), True)
    with torch.no_grad():
        q.weight.copy_(dequantize_weight(w8, scale, torch.float32))
    return q


@pytest.mark.parametrize(
    "layer,shape",
    [
        (nn.Conv2d(16, 24, 1, bias=False), (8, 16, 5, 5)),
        (nn.Conv2d(16, 32, 1, groups=4), (8, 16, 5, 5)),
        (nn.Linear(16, 12), (8, 7, 16)),
    ],
    ids=["conv1x1", "grouped1x1", "linear"],
)
def test_shift_is_the_mean_rounding_error(layer, shape):
    torch.manual_seed(0)
    x = torch.rand(shape) * 3 + 1  # large positive means, as after ReLU6
    mean = (
        x.movedim(1, -1).reshape(-1, shape[1]).mean(0)
        if x.dim() == 4
        else x.reshape(-1, 16).mean(0)
    )
    with torch.no_grad():
        err = _quantized_copy(layer)(x) - layer(x)
    per_channel = (
        err.movedim(1, -1).reshape(-1, err.shape[1]) if x.dim() == 4 else err.reshape(-1, 12)
    )
    measured = per_channel.double().mean(0)
    shift = output_shift(layer, mean, per_channel=True)
    assert torch.allclose(shift, measured, rtol=1e-4, atol=1e-6)
    assert shift.abs().max() > 1e-3  # not trivially zero


def test_kxk_conv_shift_matches_away_from_borders():
    torch.manual_seed(0)
    layer = nn.Conv2d(8, 8, 3, padding=0)
    x = torch.rand(4, 8, 9, 9) + 1
    with torch.no_grad():
        err = (_quantized_copy(layer)(x) - layer(x)).double()
    shift = output_shift(layer, x.mean((0, 2, 3)), per_channel=True)
    # no padding: every output sees 3x3 inputs with (nearly) the mean
    assert torch.allclose(shift, err.mean((0, 2, 3)), rtol=5e-2, atol=5e-4)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(8, 32, 1)
        self.pw2 = nn.Conv2d(32, 16, 1, bias=False)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu6(self.pw1(x))
        return self.fc(F.relu6(self.pw2(x)).mean((2, 3)))


def test_calibration_records_input_means_and_engines_share_the_corrected_biases():
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(16, 8, 6, 6) + 0.5
    layers = ["pw1", "pw2", "fc"]
    cal = calibrate(m, layers, [x[:8], x[8:]])
    assert torch.allclose(cal.channel_mean["pw1"], x.mean((0, 2, 3)), atol=1e-6)
    with torch.no_grad():
        fc_in = F.relu6(m.pw2(F.relu6(m.pw1(x)))).mean((2, 3))
    assert torch.allclose(cal.channel_mean["fc"], fc_in.mean(0), atol=1e-6)
    plan = QuantPlan(layers, True, cal, bias_correction=True)
    fq = build_fakequant(m, CPU, x[:1], plan)
    plain = build_fakequant(m, CPU, x[:1], QuantPlan(layers, True, cal))
    assert fq.eager.pw2.inner.bias is not None  # created where the layer had none
    assert not torch.equal(fq.eager.pw1.inner.bias, plain.eager.pw1.inner.bias)
    for kernel in ("fused", "scaled_mm"):
        fp8 = build_fp8(m, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel=kernel))
        with torch.no_grad():
            assert torch.allclose(fp8(x), fq(x), rtol=1e-3, atol=1e-3)
    # activation-only runs keep float weights: nothing to correct
    act_only = build_fakequant(m, CPU, x[:1], plan, weights=False)
    assert torch.equal(act_only.eager.pw1.inner.bias, plain.eager.pw1.inner.bias)


def test_correction_needs_calibrated_means():
    m = Net().eval()
    x = torch.randn(2, 8, 6, 6)
    cal = calibrate(m, ["pw1"], [x])
    with pytest.raises(KeyError, match="pw2"):
        correct_biases(m, ["pw2"], cal, True)
