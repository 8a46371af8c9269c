"""The FP8 depthwise layer on CUDA (the Triton kernel) against the fake-quant emulation."""

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Conv2dSame
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3, to_fp8
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise
from quantstudy.quant.layers.fused_matmul import act_reference
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec
from tests.fp8_steps import more_than_one_e4m3_step

pytestmark = pytest.mark.gpu

# EfficientNet-Lite0-like depthwise convs at batch 8: 3x3 and 5x5, stride 1 and 2 ("same").
CASES = [
    (96, 56, nn.Conv2d(96, 96, 3, padding=1, groups=96), "relu6"),
    (144, 28, Conv2dSame(144, 144, 5, 2, groups=144), "relu6"),
    (480, 14, nn.Conv2d(480, 480, 5, padding=2, groups=480), "none"),
]


@pytest.mark.parametrize("c,hw,conv,act", CASES)
def test_layer_matches_the_emulation(c, hw, conv, act):
    """fp16 output: the emulation's float32 result up to summation order and one fp16
    rounding."""
    torch.manual_seed(c)
    x = (torch.randn(8, c, hw, hw) * 2).half().float()
    with torch.no_grad():
        ref = act_reference(QDQ(conv, FP8LayerSpec(0.02, True, torch.float32))(x), act)
        layer = FusedFP8Depthwise(conv, FP8LayerSpec(0.02, True, torch.float16, act)).cuda()
        y = layer(x.cuda().half().contiguous(memory_format=torch.channels_last))
    assert y.is_contiguous(memory_format=torch.channels_last)
    y = y.float().cpu()
    assert torch.allclose(y, ref, rtol=2e-3, atol=2e-3 * ref.abs().max().item())


def test_fp8_input_and_output_match_the_emulation():
    """Reading FP8 and writing the next layer's FP8 input: `to_fp8` of the float32 result but
    where summation order straddles a rounding boundary (one FP8 step, rare)."""
    torch.manual_seed(1)
    conv = nn.Conv2d(96, 96, 3, padding=1, groups=96)
    with torch.no_grad():  # the layer holds its bias in the engine's dtype (fp16 here)
        conv.bias.copy_(conv.bias.half().float())
    x = torch.randn(8, 96, 28, 28)
    xq = to_fp8(x, torch.tensor(0.02))
    with torch.no_grad():
        ref = QDQ(conv, FP8LayerSpec(0.02, True, torch.float32))(xq.float() * 0.02).relu()
        scale = ref.abs().max().item() / 448
        layer = FusedFP8Depthwise(
            conv, FP8LayerSpec(0.02, True, torch.float16, "relu", scale, True)
        ).cuda()
        got = layer(xq.cuda().contiguous(memory_format=torch.channels_last))
    assert got.dtype == E4M3
    want = to_fp8(ref, torch.tensor(scale)).float()
    got = got.float().cpu()
    assert (got != want).float().mean() < 1e-3
    assert not (far := more_than_one_e4m3_step(got, want)), far  # tests/fp8_steps.py


def test_layer_runs_under_compile_and_cuda_graph():
    """The engine path: the input quantize fused by Inductor into the producer, the layer an
    opaque custom op, replayed from a CUDA graph."""
    torch.manual_seed(2)
    conv = nn.Conv2d(96, 96, 3, padding=1, groups=96)
    layer = FusedFP8Depthwise(conv, FP8LayerSpec(0.02, True, torch.float16, "relu6")).cuda()
    x = (
        torch.randn(8, 96, 28, 28, device="cuda")
        .half()
        .contiguous(memory_format=torch.channels_last)
    )
    fn = torch.compile(lambda t: layer(F.relu(t)), dynamic=False)
    with torch.no_grad():
        want = fn(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(x)
        graph.replay()
        # independent of the kernel: the fp32 emulation of the same FP8 conv on the CPU
        emulation = QDQ(conv, FP8LayerSpec(0.02, True, torch.float32), quant_weights=True)
        ref = act_reference(emulation(F.relu(x.float().cpu())), "relu6")
    torch.cuda.synchronize()
    assert torch.equal(out, want)  # the replay is the compiled call
    y = out.float().cpu()  # and both are the emulation, at the eager layer's tolerance above
    assert torch.allclose(y, ref, rtol=2e-3, atol=2e-3 * ref.abs().max().item()), (
        (y - ref).abs().max()
    )
