"""BatchNorm re-estimation keeps a random-weight model's activations in fp16 range."""

import timm
import torch

from quantstudy.model.batchnorm import reestimate_batchnorm


def test_reestimated_statistics_match_the_data():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    x = torch.randn(16, 3, 12, 12) * 5 + 2
    assert reestimate_batchnorm(m, [x[:8], x[8:]]) == 1
    with torch.no_grad():
        y = m(x)
    assert not m.training
    assert y.mean((0, 2, 3)).abs().max() < 0.05
    assert (y.var((0, 2, 3)) - 1).abs().max() < 0.1


def test_random_mobilenetv4_stays_finite_in_fp16_range():
    torch.manual_seed(0)
    m = timm.create_model("mobilenetv4_conv_large", pretrained=False).eval()
    x = torch.rand(4, 3, 96, 96)
    with torch.no_grad():
        before = m(x).abs().max()
        reestimate_batchnorm(m, [x])
        after = m(x).abs().max()
    assert after < 1e3 < before  # random init blows activations up; real statistics do not
