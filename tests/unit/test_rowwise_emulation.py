"""The CPU row-wise FP8 product on a torch whose CPU `torch._scaled_mm` takes per-tensor scales
only (torch 2.11): `quant.layers.matmul.cpu_rowwise_product`, chosen by a probe, not a version
string.

What equality holds: on a torch whose CPU `_scaled_mm` takes row-wise scales (2.14), the
emulation is bitwise equal to it with one thread (both scale the FP8 operands in float32 and run
one float32 product; with more threads the two may block the product differently). On every
torch it is the exactly scaled product up to float32 rounding, bounded per element below.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3
from quantstudy.quant.layers import matmul as modules
from quantstudy.quant.layers.spec import FP8LayerSpec

ROWWISE = modules.rowwise_scaled_mm_runs("cpu")
NEEDS_ROWWISE = pytest.mark.skipif(
    not ROWWISE, reason="this torch's CPU torch._scaled_mm takes per-tensor scales only"
)
SHAPES = [(64, 96, 48), (7, 32, 16), (300, 640, 160)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _operands(m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 3).to(E4M3)
    w = (torch.randn(n, k, generator=g) * 3).to(E4M3)
    sa = torch.rand(m, 1, generator=g) + 0.5
    sb = torch.rand(1, n, generator=g) + 0.5
    return a, w, sa, sb


@NEEDS_ROWWISE
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out", DTYPES)
def test_emulation_is_bitwise_the_cpu_rowwise_kernel(one_thread, shape, out):
    a, w, sa, sb = _operands(*shape)
    bias = torch.randn(shape[2], generator=torch.Generator().manual_seed(1)).to(out)
    for b in (None, bias):
        real = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, bias=b, out_dtype=out)
        assert torch.equal(modules.cpu_rowwise_product(a, w, sa, sb, b, out), real)


@pytest.mark.parametrize("shape", SHAPES)
def test_emulation_is_the_scaled_product_up_to_float32_rounding(shape):
    """Against float64 of the same FP8 values and scales: scaling each operand rounds once
    (relative 2^-24) and a K-term float32 sum adds at most K roundings, so every element is
    within (K + 2) * 2^-24 of sum |a_i * sa| * |w_i * sb| (the standard dot-product bound)."""
    a, w, sa, sb = _operands(*shape)
    y = modules.cpu_rowwise_product(a, w, sa, sb, None, torch.float32).double()
    a64, w64 = a.double() * sa.double(), w.double() * sb.double().t()
    exact = a64 @ w64.t()
    bound = (shape[1] + 2) * 2.0**-24 * (a64.abs() @ w64.abs().t())
    assert ((y - exact).abs() <= bound).all()


def test_scalar_scales_broadcast_as_the_kernel_takes_them():
    """A per-tensor weight scale with per-row activation scales (`row_scales` layers)."""
    a, w, sa, _ = _operands(16, 32, 16)
    sb = torch.tensor(0.75)
    y = modules.cpu_rowwise_product(a, w, sa, sb, None, torch.float32)
    assert torch.equal(y, (a.float() * sa) @ (w.float() * 0.75).t())


def _layer(per_channel: bool, row_scales: bool, dtype: torch.dtype) -> modules.FP8Matmul:
    torch.manual_seed(0)
    lin = nn.Linear(40, 24)  # N = 24 and K = 40 are padded to 32 and 48
    return modules.FP8Matmul(lin, FP8LayerSpec(0.02, per_channel, dtype, row_scales=row_scales))


@pytest.mark.parametrize(("per_channel", "row_scales"), [(True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_runs_the_emulation_where_the_kernel_refuses(
    monkeypatch, per_channel, row_scales, dtype
):
    """Where the probe says no row-wise kernel, the layer writes the engine's dtype with the bias
    inside (as 2.14's CPU kernel does) and says so in the engine's description."""
    monkeypatch.setattr(modules, "rowwise_scaled_mm_runs", lambda device: False)
    layer = _layer(per_channel, row_scales, dtype)
    layer.use_device(torch.device("cpu"))
    assert layer.emulated and (layer.mm_dtype, layer.bias_in_mm) == (dtype, True)
    y = layer(torch.randn(8, 40))
    assert y.dtype == dtype and y.shape == (8, 24) and torch.isfinite(y).all()
    assert "row-wise scales emulated" in modules.scaled_mm_output_of(nn.Sequential(layer))


def test_per_tensor_layer_keeps_the_real_kernel(monkeypatch):
    """Per-tensor scales on both operands need no row-wise kernel: no emulation."""
    monkeypatch.setattr(modules, "rowwise_scaled_mm_runs", lambda device: False)
    layer = _layer(False, False, torch.float32)
    layer.use_device(torch.device("cpu"))
    assert not layer.emulated
    assert "emulated" not in modules.scaled_mm_output_of(nn.Sequential(layer))


@NEEDS_ROWWISE
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_emulated_layer_equals_the_real_one(one_thread, monkeypatch, dtype):
    """The same layer, emulated and on the real row-wise kernel, gives the same bits."""
    x = torch.randn(64, 40)
    real = _layer(True, False, dtype)
    real.use_device(torch.device("cpu"))
    assert not real.emulated and (real.mm_dtype, real.bias_in_mm) == (dtype, True)
    monkeypatch.setattr(modules, "rowwise_scaled_mm_runs", lambda device: False)
    emulated = _layer(True, False, dtype)
    emulated.use_device(torch.device("cpu"))
    assert emulated.emulated
    assert torch.equal(emulated(x), real(x))


def test_probe_answers_what_the_kernel_does():
    a, w, sa, sb = _operands(16, 16, 16)
    try:
        torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        runs = True
    except RuntimeError:
        runs = False
    assert modules.rowwise_scaled_mm_runs("cpu") is runs
