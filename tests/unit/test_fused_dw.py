"""The FP8 depthwise conv on CPU: the layer and its Triton kernel (interpreted) against the
fake-quant emulation (`QDQ` in fp32), and its place in the fused engine (real, its activation
in the epilogue, FP8 hand-offs on both sides)."""

import copy

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from timm.layers import Conv2dSame
from torch import nn

from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise, depthwise_fp8_blocker
from quantstudy.quant.layers.fused_matmul import act_reference
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import QuantPlan, apply_fp8, real_layers
from quantstudy.record.build_spec import BuildSpec

CASES = [  # (channels, size, kernel, stride, padding or "same", act)
    (32, 9, 3, 1, 1, "relu6"),
    (24, 10, 3, 2, 1, "none"),
    (40, 11, 5, 2, "same", "relu"),
    (16, 8, 5, 1, 2, "silu"),
    (8, 8, 1, 2, 0, "none"),  # strided 1x1: the rows a stride never reads are cropped
]


def _conv(c: int, k: int, s: int, p) -> nn.Conv2d:
    if p == "same":
        return Conv2dSame(c, c, k, stride=s, groups=c)
    return nn.Conv2d(c, c, k, stride=s, padding=p, groups=c)


@pytest.mark.parametrize("c,hw,k,s,p,act", CASES)
def test_layer_equals_the_emulation_in_fp32(c, hw, k, s, p, act):
    """FP8 input, FP8 weights dequantized to float32, float32 sums: the emulation's numbers up
    to summation order (the layer multiplies the input scale after the sum)."""
    torch.manual_seed(c + k)
    conv = _conv(c, k, s, p)
    x = torch.randn(2, c, hw, hw) * 2
    emu = QDQ(conv, FP8LayerSpec(0.02, True, torch.float32))
    layer = FusedFP8Depthwise(conv, FP8LayerSpec(0.02, True, torch.float32, act))
    with torch.no_grad():
        want = act_reference(emu(x), act)
        got = layer(x)
    assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


def test_fp8_input_and_output():
    """Reading its producer's FP8 map and writing the next layer's FP8 input: the emulation's
    output quantized with that scale, but where summation order straddles an FP8 rounding."""
    from quantstudy.quant.formats.fp8 import E4M3, to_fp8

    torch.manual_seed(3)
    conv = _conv(32, 3, 1, 1)
    x = torch.randn(2, 32, 9, 9)
    xq = to_fp8(x, torch.tensor(0.02))
    emu = QDQ(conv, FP8LayerSpec(0.02, True, torch.float32))
    out_scale = 0.01
    layer = FusedFP8Depthwise(
        conv, FP8LayerSpec(0.02, True, torch.float32, "relu", out_scale, fp8_input=True)
    )
    with torch.no_grad():
        want = to_fp8(emu(xq.float() * 0.02).relu(), torch.tensor(out_scale)).float()
        got = layer(xq)
    assert got.dtype == E4M3
    assert (got.float() != want).float().mean() < 1e-3
    with pytest.raises(TypeError, match="reads FP8"):
        layer(x)


def test_blocker():
    assert depthwise_fp8_blocker(_conv(16, 3, 1, 1)) is None
    assert depthwise_fp8_blocker(_conv(16, 3, 2, "same")) is None
    assert "one channel per group" in depthwise_fp8_blocker(nn.Conv2d(16, 16, 3, groups=4))
    assert "one channel per group" in depthwise_fp8_blocker(nn.Conv2d(16, 32, 3, groups=16))
    assert "dilated" in depthwise_fp8_blocker(nn.Conv2d(16, 16, 3, dilation=2, groups=16))
    assert "padding" in depthwise_fp8_blocker(
        nn.Conv2d(16, 16, 3, padding=1, groups=16, padding_mode="reflect")
    )
    with pytest.raises(ValueError, match="one channel per group"):
        FusedFP8Depthwise(nn.Conv2d(16, 16, 3, groups=4), FP8LayerSpec(0.1, True, torch.float32))


class _InvertedResidual(nn.Module):
    """expand 1x1 -> BN -> ReLU6 -> depthwise 3x3 -> BN -> ReLU6 -> project 1x1 (+ input)."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(16, 64, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.act1 = nn.ReLU6()
        self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.act2 = nn.ReLU6()
        self.project = nn.Conv2d(64, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act2(self.bn2(self.dw(self.act1(self.bn1(self.expand(x))))))
        return self.project(y) + x


def test_fused_engine_runs_the_depthwise_conv_real_with_fp8_on_both_sides():
    """Only the fused kernel makes a depthwise conv real; the engine moves its activation into
    its epilogue and hands FP8 from the expand conv to it and from it to the project conv, and
    in float32 computes the emulation's numbers up to summation order."""
    from quantstudy.engines.builders import build_fakequant, build_fp8
    from quantstudy.engines.run import run_engine

    torch.manual_seed(0)
    model = _InvertedResidual().eval()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 16, 10, 10)
    layers = ["expand", "dw", "project"]
    assert real_layers(model, layers, "fused") == layers
    assert real_layers(model, layers, "scaled_mm") == ["expand", "project"]
    plan = QuantPlan(layers, True, calibrate(model, layers, [x]))
    cpu = torch.device("cpu")
    engine = build_fp8(model, cpu, x[:1], plan, spec=BuildSpec(kernel="fused"), dtype=torch.float32)
    info = engine.info()
    assert info.fp8_real == layers and not info.fp8_emulated
    assert info.layout.epilogue.get("dw") == "relu6"
    assert info.layout.handoff == {"expand": "dw", "dw": "project"}
    dw = engine.eager.get_submodule("dw")
    assert isinstance(dw, FusedFP8Depthwise) and dw.fp8_input and dw.out_scale is not None
    emu = build_fakequant(model, cpu, x[:1], plan)
    got, want = run_engine(engine, x, 4), run_engine(emu, x, 4)
    # FP8 hand-offs round where the emulation quantizes; only summation order differs (measured
    # here: 6e-8 of the largest output)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    unfused = copy.deepcopy(model)
    applied = apply_fp8(unfused, model, plan, torch.float32, "scaled_mm")
    assert [n for n, _ in applied.emulated] == ["dw"]


def test_profiles_file_the_kernel_as_a_depthwise_conv():
    from quantstudy.speed.kernels import group_kernel

    assert group_kernel("_depthwise_kernel") == "depthwise_conv"


def test_kernel_under_the_interpreter_matches_the_torch_path():
    """The Triton kernel (fp32 output; FP8 output is checked on the GPU, the interpreter
    converts float32 to FP8 wrongly) against the op's torch path, "same" and fixed padding."""
    require_triton()
    (worst,) = run_interpreted(
        """
        import torch
        from timm.layers import Conv2dSame
        from torch import nn
        from quantstudy.quant.formats.fp8 import to_fp8
        from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise, fp8_depthwise
        from quantstudy.quant.kernels.depthwise import depthwise_taps
        from quantstudy.quant.layers.spec import FP8LayerSpec
        torch.manual_seed(0)
        worst = 0.0
        convs = (nn.Conv2d(24, 24, 3, padding=1, groups=24), Conv2dSame(40, 40, 5, 2, groups=40))
        for conv in convs:
            layer = FusedFP8Depthwise(conv, FP8LayerSpec(0.03, True, torch.float32, "relu6"))
            x = torch.randn(2, conv.in_channels, 9, 9)
            xq = to_fp8(x, layer.x_scale).contiguous(memory_format=torch.channels_last)
            pad, out_hw = layer.geometry(9, 9)
            args = (xq, layer.taps, layer.w_scale, layer.kernel_hw, layer.x_scale, layer.bias,
                    "relu6", torch.float32, layer.stride[0], pad, out_hw)
            y = depthwise_taps(xq, layer.taps, tuple(layer.kernel_hw), layer.bias, layer.stride[0],
                               tuple(pad), tuple(out_hw), "relu6", layer.x_scale, None,
                               torch.float32, (16, 32, 4), w_scale=layer.w_scale)
            ref = fp8_depthwise(*args)
            worst = max(worst, ((y - ref).abs().max() / ref.abs().max()).item())
        print(worst)
        """
    )
    assert float(worst) < 1e-5
