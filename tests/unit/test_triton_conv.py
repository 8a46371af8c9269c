"""The FP8 kxk convolution on CPU: its Triton kernel (interpreted) and the layer against the
fake-quant emulation (`QDQ` in fp32), and its place in the fused engine."""

import copy

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from torch import nn

from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d, kxk_fp8_blocker
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import QuantPlan, apply_fp8, real_layers


def test_conv_kernel_under_the_interpreter_matches_the_emulation():
    """Implicit GEMM against `QDQ` (quantize-dequantize, fp32 conv): 3x3 res2net-like maps with
    channels that fill no K step (26), stride 2, a 1x3 kernel with dilation, a 5x5 one with
    more channels than one K step, channels-last and plain NCHW input, with each activation
    and bias or none. The two differ only in fp32 summation order (the kernel multiplies the
    scales after the sum, the emulation before), so they agree to a few fp32 ulps of the
    largest output; the torch path of the op equals the emulation the same way. Channels are
    zero-padded to 16 as the layer pads them."""
    require_triton()
    worst, worst_op, runs = run_interpreted(
        """
        import torch
        from torch import nn
        from quantstudy.quant.formats.fp8 import to_fp8
        from quantstudy.quant.layers.fused_matmul import act_reference
        from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
        from quantstudy.quant.layers.matmul import QDQ
        from quantstudy.quant.kernels.conv import fp8_conv2d_triton, tap_major
        from quantstudy.quant.layers.spec import FP8LayerSpec
        torch.manual_seed(0)
        cases = [  # (B, C, H, W, N, kernel, stride, padding, dilation, bias, act, channels-last)
            (2, 26, 9, 9, 26, (3, 3), (1, 1), (1, 1), (1, 1), True, "relu", True),
            (1, 40, 7, 5, 20, (3, 3), (2, 2), (1, 1), (1, 1), False, "none", True),
            (2, 16, 6, 8, 24, (1, 3), (1, 1), (0, 2), (1, 2), True, "silu", False),
            (1, 48, 6, 6, 33, (5, 5), (1, 1), (2, 2), (1, 1), True, "relu6", True),
        ]
        worst, worst_op, runs = 0.0, 0.0, 0
        for b, c, h, w, n, k, s, p, d, has_bias, act, cl in cases:
            conv = nn.Conv2d(c, n, k, stride=s, padding=p, dilation=d, bias=has_bias)
            x = torch.randn(b, c, h, w) * 2
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            xs = 0.02
            emu = QDQ(conv, FP8LayerSpec(xs, True, torch.float32))
            ref = act_reference(emu(x), act)
            layer = FusedFP8Conv2d(conv, FP8LayerSpec(xs, True, torch.float32, act))
            pad = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, layer.c_pad))  # as the layer does
            xq = to_fp8(pad, layer.x_scale).contiguous(memory_format=torch.channels_last)
            if not cl:  # the kernel reads any layout
                xq = xq.contiguous()
            for tile in [(32, 32, 32), (16, 64, 16)]:
                y = fp8_conv2d_triton(
                    xq, layer.w_taps, k, layer.w_scale, layer.x_scale, layer.bias, act,
                    torch.float32, s, p, d, tile=tile,
                )
                assert y.shape == ref.shape and y.is_contiguous(memory_format=torch.channels_last)
                worst = max(worst, ((y - ref).abs().max() / ref.abs().max()).item())
                runs += 1
            with torch.no_grad():
                worst_op = max(worst_op, ((layer(x) - ref).abs().max() / ref.abs().max()).item())
        print(worst, worst_op, runs)
        """
    )
    assert int(runs) == 8
    assert float(worst) < 1e-5 and float(worst_op) < 1e-5


def test_conv_kernel_rounds_where_the_unfused_engine_stores_under_the_interpreter():
    """With `round_to` fp16 the kernel equals the op's torch path with the same rounding. (Its
    FP8 output is checked on the GPU only: the interpreter converts float32 to FP8 wrongly.)"""
    require_triton()
    (same,) = run_interpreted(
        """
        import torch
        from torch import nn
        from quantstudy.quant.formats.fp8 import to_fp8
        from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d, fp8_conv2d
        from quantstudy.quant.kernels.conv import fp8_conv2d_triton
        from quantstudy.quant.layers.spec import FP8LayerSpec
        torch.manual_seed(3)
        conv = nn.Conv2d(26, 26, 3, padding=1)
        x = (torch.randn(2, 26, 8, 8) * 2).contiguous(memory_format=torch.channels_last)
        layer = FusedFP8Conv2d(conv, FP8LayerSpec(0.03, True, torch.float16, "relu"))
        xq = to_fp8(torch.nn.functional.pad(x, (0, 0, 0, 0, 0, layer.c_pad)), layer.x_scale)
        args = (xq, layer.w_taps, [3, 3], layer.w_scale, layer.x_scale, layer.bias, "relu")
        geo = ([1, 1], [1, 1], [1, 1])
        y = fp8_conv2d_triton(*args, torch.float16, *geo, round_to=torch.float16, tile=(32, 32, 32))
        ref = fp8_conv2d(*args, torch.float16, *geo, None, torch.float16)
        every = fp8_conv2d_triton(*args, torch.float16, *geo, round_to=torch.float16,
                                  tile=(32, 32, 16), promote=16)
        print(min((y == ref).float().mean().item(), (every == ref).float().mean().item()))
        """
    )
    assert float(same) > 0.999


def test_conv_kernel_refuses_a_promotion_it_cannot_keep():
    require_triton()
    from quantstudy.quant.kernels.conv import fp8_conv2d_triton

    xq = torch.zeros(1, 16, 4, 4).to(torch.float8_e4m3fn)
    w = torch.zeros(8, 9 * 16).to(torch.float8_e4m3fn)
    args = (xq, w, (3, 3), torch.ones(8), torch.tensor(1.0), None, "none", torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        fp8_conv2d_triton(*args, promote=48)
    with pytest.raises(ValueError, match="products per promotion"):
        fp8_conv2d_triton(*args, tile=(32, 32, 64), promote=32)


def test_blocker_and_layer_checks():
    assert kxk_fp8_blocker(nn.Conv2d(26, 26, 3, padding=1)) is None
    assert kxk_fp8_blocker(nn.Conv2d(26, 26, 3, padding=1, groups=26)) is not None
    assert kxk_fp8_blocker(nn.Conv2d(26, 26, 3, padding="same")) is not None
    assert kxk_fp8_blocker(nn.Conv2d(26, 26, 3, padding=1, padding_mode="reflect")) is not None
    from timm.layers import Conv2dSame

    assert kxk_fp8_blocker(Conv2dSame(26, 26, 3)) is not None
    conv = nn.Conv2d(16, 8, 3, padding=1)
    layer = FusedFP8Conv2d(conv, FP8LayerSpec(0.1, True, torch.float32, fp8_input=True))
    with pytest.raises(TypeError, match="reads FP8"):
        layer(torch.randn(1, 16, 4, 4))
    with pytest.raises(ValueError, match="cannot be padded"):  # 8 channels: padded to 16
        FusedFP8Conv2d(nn.Conv2d(8, 8, 3), FP8LayerSpec(0.1, True, torch.float32, fp8_input=True))


class _Block(nn.Module):
    """1x1 -> 3x3 -> 1x1 with BatchNorm and ReLU, as a res2net bottleneck's convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.act2 = nn.ReLU()
        self.conv3 = nn.Conv2d(32, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.act2(self.bn2(self.conv2(self.conv1(x))))) + x


def test_fused_engine_runs_the_3x3_conv_real_and_equals_the_emulation_in_fp32():
    """Only the fused kernel makes a kxk conv real (the unfused one has no FP8 conv); in
    float32 the fused layers compute the emulation's numbers up to summation order."""
    torch.manual_seed(0)
    model = _Block().eval()
    with torch.no_grad():
        model.bn2.running_mean.uniform_(-0.5, 0.5)
        model.bn2.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 16, 10, 10)
    layers = ["conv1", "conv2", "conv3"]
    assert real_layers(model, layers, "fused") == layers
    assert real_layers(model, layers, "scaled_mm") == ["conv1", "conv3"]
    plan = QuantPlan(layers, True, calibrate(model, layers, [x]))
    fused, unfused, emu = (copy.deepcopy(model) for _ in range(3))
    applied = apply_fp8(fused, model, plan, torch.float32, "fused")
    assert applied.real == layers and isinstance(fused.conv2, FusedFP8Conv2d)
    applied = apply_fp8(unfused, model, plan, torch.float32, "scaled_mm")
    assert [n for n, _ in applied.emulated] == ["conv2"]
    for name in layers:
        layer = model.get_submodule(name)
        setattr(
            emu,
            name,
            QDQ(layer, FP8LayerSpec(plan.calibration.scale_of(name), True, torch.float32)),
        )
    with torch.no_grad():
        want = emu(x)
        got = fused(x.contiguous(memory_format=torch.channels_last))
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


def test_profiles_file_the_conv_kernel_as_an_fp8_product():
    """Its Triton name is what the profiler records; the kernel groups must count it as an FP8
    matrix product (the ideal x and the kernel tables read that group)."""
    from quantstudy.speed.kernels import group_kernel

    assert group_kernel("_fp8_conv2d_kernel") == "fp8_matmul"
