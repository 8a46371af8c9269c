"""The depthwise Triton kernel on CUDA: fp16 and FP8 in, fp16 and FP8 out, against cuDNN's conv."""

import pytest
import torch
import torch.nn.functional as F

from tests.fp8_steps import more_than_one_e4m3_step


@pytest.mark.parametrize("fp8_in,fp8_out", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("k,stride", [(3, 1), (5, 2)])
def test_depthwise_kernel_matches_the_fp16_conv(k, stride, fp8_in, fp8_out):
    from quantstudy.quant.formats.fp8 import E4M3, to_fp8
    from quantstudy.quant.kernels.depthwise import depthwise_conv

    torch.manual_seed(k + stride)
    c, h = 96, 28
    x = torch.randn(8, c, h, h, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, 1, k, k, device="cuda") / k
    bias = torch.randn(c, device="cuda")
    p = k // 2
    ho = (h + 2 * p - k) // stride + 1
    xs = torch.tensor(0.02, device="cuda") if fp8_in else None
    xin = to_fp8(x, xs).contiguous(memory_format=torch.channels_last) if fp8_in else x.half()
    deq = xin.float() * xs if fp8_in else xin.float()
    ref = F.conv2d(deq, w, bias, stride=stride, padding=p, groups=c).relu()
    os_ = ref.abs().amax() / 448 if fp8_out else None
    dtype = E4M3 if fp8_out else torch.float16
    y = depthwise_conv(xin, w, bias, stride, (p, p), (ho, ho), "relu", xs, os_, dtype)
    assert y.is_contiguous(memory_format=torch.channels_last)
    if fp8_out:  # one FP8 rounding of the float32 result, summation order aside
        want = to_fp8(ref, os_).float()
        assert (y.float() != want).float().mean() < 1e-3
        assert not (far := more_than_one_e4m3_step(y.float().cpu(), want.cpu())), far
    else:
        assert torch.allclose(y.float(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fp8_out", [False, True])
def test_every_tile_writes_the_same_bits(fp8_out):
    """`depthwise._prune` keeps any tile because each output sums its taps in one order in
    float32 whatever the tile (a quality pass launches the first kept tile untimed): every tile
    of the table writes the first one's bits, ragged edges in pixels and channels included."""
    from quantstudy.quant.formats.fp8 import E4M3, to_fp8
    from quantstudy.quant.kernels.depthwise import TILES, depthwise_conv

    torch.manual_seed(7)
    c, h, k, stride = 136, 27, 5, 2  # neither a multiple of any tile's channels nor pixels
    x = torch.randn(4, c, h, h, device="cuda")
    xs = torch.tensor(0.02, device="cuda")
    xin = to_fp8(x, xs).contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, 1, k, k, device="cuda") / k
    bias = torch.randn(c, device="cuda")
    p = k // 2
    ho = (h + 2 * p - k) // stride + 1
    os_ = torch.tensor(0.01, device="cuda") if fp8_out else None
    dtype = E4M3 if fp8_out else torch.float16
    outs = [
        depthwise_conv(xin, w, bias, stride, (p, p), (ho, ho), "relu6", xs, os_, dtype, tile)
        for tile in TILES
    ]
    first = outs[0].view(torch.uint8) if fp8_out else outs[0]
    for tile, y in zip(TILES[1:], outs[1:], strict=True):
        assert torch.equal(y.view(torch.uint8) if fp8_out else y, first), tile
