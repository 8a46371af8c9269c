"""Fused FP8 layers writing the next conv's zero padding (`quant/rewrites/pad_handoff.py`), on the
CPU."""

import pytest
import torch
from timm.layers.conv2d_same import Conv2dSame
from timm.layers.padding import get_same_padding
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.engines.kernel_choice import choose_kernels
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.padding import OutputPad, same_pad
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.build_spec import BuildSpec
from tests.unit._interpreter import require_triton, run_interpreted

CPU = torch.device("cpu")


class _Block(nn.Module):
    """expand (1x1, BN, ReLU6) -> strided "same" depthwise conv -> project (1x1) -> a 1x1 conv
    whose output a fixed `nn.ZeroPad2d` pads for a 3x3 conv, and a 1x1 conv whose output is
    also read by the shortcut (no padding may be written around it)."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(16, 48, 1, bias=False)
        self.bn = nn.BatchNorm2d(48)
        self.act = nn.ReLU6()
        self.dw = Conv2dSame(48, 48, 3, stride=2, groups=48)
        self.pwl = nn.Conv2d(48, 32, 1)
        self.pad = nn.ZeroPad2d((1, 2, 0, 1))
        self.conv = nn.Conv2d(32, 32, 3)
        self.side = nn.Conv2d(32, 32, 1)
        self.dw2 = Conv2dSame(32, 32, 5, stride=2, groups=32)

    def forward(self, x):
        y = self.pwl(self.dw(self.act(self.bn(self.pw(x)))))
        y = self.conv(self.pad(y))
        s = self.side(y)
        return self.dw2(s) + s[:, :, ::2, ::2]


def _setup(h: int = 15, w: int = 12):
    torch.manual_seed(0)
    model = _Block().eval()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(3, 16, h, w)
    layers = ["pw", "pwl", "side"]
    return model, x, QuantPlan(layers, True, calibrate(model, layers, [x]))


@pytest.mark.parametrize("size", [1, 2, 7, 14, 15, 112, 113])
@pytest.mark.parametrize("kernel,stride,dilation", [(3, 2, 1), (5, 2, 1), (3, 1, 1), (3, 2, 2)])
def test_same_padding_is_timms(size, kernel, stride, dilation):
    before, after = same_pad(size, kernel, stride, dilation)
    total = get_same_padding(size, kernel, stride, dilation)
    assert before + after == total and before == total // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,w", [(15, 12), (16, 16)])
def test_padded_outputs_leave_the_engine_bit_identical(dtype, h, w):
    """pw writes dw's "same" padding (odd and even sizes: 0 or 1 pixel after), pwl the fixed
    ZeroPad2d's; side's output has a second reader, so dw2 keeps its own pad. The engine's
    output equals the engine that pads in passes of its own, bit for bit."""
    model, x, plan = _setup(h, w)
    padded = build_fp8(model, CPU, x, plan, dtype=dtype)
    apart = build_fp8(model, CPU, x, plan, dtype=dtype, spec=BuildSpec(pad_outputs=False))
    assert padded.info().layout.padded_output == {"pw": "dw", "pwl": "pad"}
    assert apart.info().layout.padded_output == {}
    m = padded.eager
    assert m.pw.out_pad == OutputPad(kernel=(3, 3), stride=(2, 2), dilation=(1, 1))
    assert m.pwl.out_pad == OutputPad(fixed=(1, 2, 0, 1)) and m.side.out_pad is None
    assert type(m.dw) is nn.Conv2d and m.dw.padding == (0, 0) and isinstance(m.pad, nn.Identity)
    assert isinstance(m.dw2, Conv2dSame) and "padded out same" in repr(m.pw)
    with torch.no_grad():
        got, want = m(padded.prepare(x)), apart.eager(apart.prepare(x))
    assert torch.equal(got, want)


def test_a_padded_layer_keeps_its_fused_kernel_in_the_per_layer_choice():
    """It has no unfused counterpart that writes padding: not timed, kept fused, and why."""
    model, x, plan = _setup()
    built = build_fp8(model, CPU, x, plan, dtype=torch.float32)
    choices = choose_kernels(
        built.eager, model, plan, torch.float32, x, CPU, [2], timer=lambda fn: 1.0
    )
    why = {c.name: c.why for c in choices}
    assert why["pw"] == why["pwl"] == "writes the next conv's padded input"
    assert isinstance(built.eager.pw, FusedFP8Matmul)


def test_a_padded_output_refuses_a_residual():
    model, x, plan = _setup()
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32).eager
    with pytest.raises(ValueError, match="padded output is the layer's own"):
        m.pw(torch.randn(1, 16, 4, 4), torch.randn(1, 48, 4, 4))


def test_mapped_output_of_the_wrong_shape_is_refused():
    require_triton()
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    xq = torch.zeros(12, 16).to(torch.float8_e4m3fn)
    w8 = torch.zeros(8, 16).to(torch.float8_e4m3fn)
    args = (xq, w8, torch.ones(8), torch.tensor(1.0), None, "none", torch.float16)
    with pytest.raises(ValueError, match=r"\(B, H, W, 8\)"):
        fp8_gemm_triton(*args, out=torch.zeros(1, 3, 3, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"one torch\.float16 tensor"):
        fp8_gemm_triton(*args, out=torch.zeros(1, 3, 4, 8))


def test_kernel_writes_the_interior_of_a_padded_buffer_under_the_interpreter():
    """The mapped store (pointer path) puts each row at its pixel of the padded buffer and
    touches nothing else: the interior equals the plain output, bit for bit, and a sentinel
    border stays as it was. Handed the whole buffer and the interior's origin in it
    (`out_base`, the package's path), it writes the same bytes; `zero_border` then zeroes
    the border and nothing else."""
    require_triton()
    (same,) = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.border import zero_border
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(5)
        b, h, w, k, n = 2, 5, 7, 32, 48
        m = b * h * w
        xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(n, generator=g) / 7 + 0.01, torch.tensor(0.37)
        bias = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
        args = (xq, w8, ws, xs, bias, "relu6", torch.float16, (32, 32, 32))
        plain = fp8_gemm_triton(*args, round_to=torch.float16)
        buf = torch.full((b, h + 2, w + 3, n), 7.0, dtype=torch.float16)
        fp8_gemm_triton(*args, round_to=torch.float16, out=buf[:, 1 : 1 + h, 2 : 2 + w])
        inner = buf[:, 1 : 1 + h, 2 : 2 + w].reshape(m, n)
        border = buf.clone()
        border[:, 1 : 1 + h, 2 : 2 + w] = 7.0
        alt = torch.full_like(buf, 7.0)
        fp8_gemm_triton(*args, round_to=torch.float16, out=alt[:, 1 : 1 + h, 2 : 2 + w],
                        out_base=alt)
        zero_border(alt, (b, h, w), (2, 1, 1, 1))
        zeroed = buf.clone()
        zeroed[:, :1] = 0
        zeroed[:, 1 + h :] = 0
        zeroed[:, :, :2] = 0
        zeroed[:, :, 2 + w :] = 0
        print(int(torch.equal(inner, plain) and bool((border == 7.0).all())
                  and torch.equal(alt, zeroed)))
        """
    )
    assert same == "1"


def test_out_base_that_does_not_hold_the_output_is_refused():
    require_triton()
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    xq = torch.zeros(24, 16).to(torch.float8_e4m3fn)
    w8 = torch.zeros(8, 16).to(torch.float8_e4m3fn)
    args = (xq, w8, torch.ones(8), torch.tensor(1.0), None, "none", torch.float16)
    buf = torch.zeros(2, 5, 6, 8, dtype=torch.float16)
    interior = buf[:, 1:4, 1:5]
    with pytest.raises(ValueError, match="dense"):
        fp8_gemm_triton(*args, out=interior, out_base=buf[:, 1:])
    other = torch.zeros(2, 5, 7, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="dense"):
        fp8_gemm_triton(*args, out=interior, out_base=other)
    with pytest.raises(ValueError, match=r"torch\.float16 on cpu"):
        fp8_gemm_triton(*args, out=interior, out_base=buf.float())
    small = torch.zeros(1, 5, 6, 8, dtype=torch.float16)  # one image of the two
    with pytest.raises(ValueError, match="inside"):
        fp8_gemm_triton(*args, out=interior, out_base=small)


def test_zero_border_refuses_a_buffer_that_is_not_the_padded_size():
    require_triton()
    from quantstudy.quant.kernels.border import zero_border

    with pytest.raises(ValueError, match="not"):
        zero_border(torch.zeros(1, 5, 6, 8), (1, 3, 4), (1, 1, 1, 2))
    with pytest.raises(ValueError, match="dense"):
        zero_border(torch.zeros(1, 5, 6, 8)[:, :, :5], (1, 3, 3), (1, 1, 1, 1))


def test_a_reader_the_plan_quantizes_keeps_its_own_padding():
    """With the strided depthwise conv in the plan too, it is no float `Conv2dSame` in the
    engine: pw writes no padding for it; and fuse_padded refuses a reader that pads nothing."""
    from quantstudy.quant.rewrites.pad_handoff import fuse_padded

    model, x, _ = _setup()
    layers = ["pw", "dw", "pwl", "side"]
    plan = QuantPlan(layers, True, calibrate(model, layers, [x]))
    built = build_fp8(model, CPU, x, plan, dtype=torch.float32)
    assert built.info().layout.padded_output == {"pwl": "pad"}
    assert built.eager.pw.out_pad is None and type(built.eager.dw) is not nn.Conv2d
    with torch.no_grad():
        assert torch.isfinite(built.eager(built.prepare(x))).all()
    engine = build_fp8(
        model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(pad_outputs=False)
    ).eager
    with pytest.raises(ValueError, match="not the same zero padding"):
        fuse_padded(engine, model, {"pwl": "conv"})
