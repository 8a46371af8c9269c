"""The depthwise Triton kernel (`quant/kernels/depthwise.py`) under Triton's interpreter, against
torch."""

import pytest
from _interpreter import require_triton, run_interpreted

require_triton()  # CUDA builds of torch ship Triton: skip only on a build without it

from quantstudy.quant.kernels.depthwise import depthwise_conv  # noqa: E402
from quantstudy.quant.kernels.layout import same_padding  # noqa: E402


def test_same_padding_matches_tensorflow():
    # out = ceil(size / stride); the odd padding pixel goes after the map
    assert same_padding(112, 3, 2) == (56, 0)
    assert same_padding(10, 5, 2) == (5, 1)
    assert same_padding(7, 3, 1) == (7, 1)


def test_depthwise_kernel_under_the_interpreter_matches_torch():
    """Symmetric and "same" (asymmetric) padding, strides 1 and 2, 3x3 and 5x5, channel counts
    that do not fill a block, fp32 and FP8 inputs (fp32 output: the interpreter converts to FP8
    wrongly, so FP8 writes are checked on the GPU only)."""
    runs, worst = run_interpreted(
        """
        import torch, torch.nn.functional as F
        from quantstudy.quant.layers.fused_matmul import act_reference
        from quantstudy.quant.kernels.depthwise import depthwise_conv
        from quantstudy.quant.kernels.layout import same_padding
        g = torch.Generator().manual_seed(0)
        worst, runs = 0.0, 0
        cases = [(2, 40, 9, 9, 3, 1, False), (1, 24, 10, 10, 5, 2, True), (2, 70, 7, 8, 3, 2, True)]
        for b, c, h, w, k, s, same in cases:
            for fp8 in (False, True):
                x = torch.randn(b, c, h, w, generator=g)
                wt = torch.randn(c, 1, k, k, generator=g) / k
                bias = torch.randn(c, generator=g)
                if same:
                    (ho, pt), (wo, pl) = same_padding(h, k, s), same_padding(w, k, s)
                    pads = (pl, (wo - 1) * s + k - w - pl, pt, (ho - 1) * s + k - h - pt)
                else:
                    p = k // 2
                    ho, wo, pt, pl = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1, p, p
                    pads = (p, p, p, p)
                xs = torch.tensor(0.02) if fp8 else None
                xin = (x / xs).clamp(-448, 448).to(torch.float8_e4m3fn) if fp8 else x
                deq = xin.float() * xs if fp8 else x
                ref = F.conv2d(F.pad(deq, [max(v, 0) for v in pads]), wt, bias, stride=s, groups=c)
                ref = act_reference(ref, "relu6")
                y = depthwise_conv(
                    xin.contiguous(memory_format=torch.channels_last), wt, bias, s, (pt, pl),
                    (ho, wo), "relu6", x_scale=xs, out_dtype=torch.float32, tile=(16, 32, 4),
                )
                worst, runs = max(worst, (y - ref).abs().max().item()), runs + 1
        print(runs, worst)
        """
    )
    assert int(runs) == 6
    assert float(worst) < 1e-5  # float32 sums of at most 25 taps in another order


def test_depthwise_kernel_refuses_what_it_cannot_read():
    import torch

    x = torch.randn(1, 8, 4, 4)  # NCHW-contiguous, not channels-last
    with pytest.raises(ValueError, match="channels-last"):
        depthwise_conv(x, torch.randn(8, 1, 3, 3), None, 1, (1, 1), (4, 4))
    x = x.contiguous(memory_format=torch.channels_last).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="x_scale"):
        depthwise_conv(x, torch.randn(8, 1, 3, 3), None, 1, (1, 1), (4, 4))
