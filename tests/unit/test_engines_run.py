"""Running engines: the emulation with half-precision storage (`run_half_storage`)."""

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import BuiltEngine
from quantstudy.engines.run import run_engine, run_half_storage, run_reordered
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec

torch.set_num_threads(1)


def _engine(module: nn.Module) -> BuiltEngine:
    return BuiltEngine("fakequant", torch.device("cpu"), torch.float32, False, module, module,
                       False, None)  # fmt: skip


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    stem = nn.Conv2d(3, 8, 3, padding=1)
    pointwise = QDQ(nn.Conv2d(8, 16, 1), FP8LayerSpec(0.01, True, torch.float32))
    return nn.Sequential(stem, nn.ReLU(), pointwise, nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def _half(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).float()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_rounds_outputs_and_float_weights_not_the_fp8_layers(dtype):
    """The run equals the same network computed by hand with every module's output and the
    float layers' weights and biases rounded to `dtype`; the FP8 layer keeps its weights."""
    net = _net().eval()
    x = torch.randn(3, 3, 4, 4)
    stem, relu, pointwise, flatten, head = net
    with torch.no_grad():
        h = _half(nn.functional.conv2d(x, _half(stem.weight, dtype), _half(stem.bias, dtype),
                                       padding=1), dtype)  # fmt: skip
        h = _half(pointwise(_half(relu(h), dtype)), dtype)
        want = _half(nn.functional.linear(flatten(h), _half(head.weight, dtype),
                                          _half(head.bias, dtype)), dtype)  # fmt: skip
    got = run_half_storage(_engine(net), x, dtype, batch_size=2)
    assert torch.equal(got, want)
    assert not torch.equal(got, run_engine(_engine(net), x, batch_size=2))


def test_half_storage_restores_the_emulation():
    """Parameters and hooks are put back: the emulation computes what it did before, bit for bit,
    also when the run fails."""
    net = _net().eval()
    x = torch.randn(2, 3, 4, 4)
    before = run_engine(_engine(net), x)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    run_half_storage(_engine(net), x, torch.float16)
    with pytest.raises(RuntimeError):
        run_half_storage(_engine(net), torch.randn(2, 5, 4, 4), torch.float16)  # wrong channels
    assert torch.equal(run_engine(_engine(net), x), before)
    assert all(torch.equal(p, params[n]) for n, p in net.named_parameters())


def test_half_storage_needs_an_eager_module():
    engine = _engine(_net())
    engine.module = lambda x: x  # a plain callable, as a compiled engine holds
    with pytest.raises(TypeError, match=r"eager nn\.Module"):
        run_half_storage(engine, torch.randn(1, 3, 4, 4), torch.float16)


def test_the_reordered_run_leaves_the_emulation_in_its_own_layout():
    """After the floor's channels-last run, the emulation's weights are back in NCHW, so a later
    run (the half-precision storage run) sums in the emulation's own order."""
    net = _net().eval()
    x = torch.randn(2, 3, 4, 4)
    engine = _engine(net)
    run_reordered(engine, x)
    assert not engine.channels_last
    assert all(p.is_contiguous() for p in net.parameters())


class _Gained(nn.Module):
    """A module with a parameter of its own and a child: its parameter is stored in half too."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.randn(4, 1, 1))
        self.inner = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


def test_half_storage_rounds_buffers_and_parameters_of_modules_with_children():
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(4).eval()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    net = nn.Sequential(bn, _Gained()).eval()
    x = torch.randn(2, 4, 3, 3)
    dtype = torch.float16
    before = {n: t.clone() for n, t in net.state_dict().items()}
    with torch.no_grad():
        h = nn.functional.batch_norm(
            x, _half(bn.running_mean, dtype), _half(bn.running_var, dtype),
            _half(bn.weight, dtype), _half(bn.bias, dtype), eps=bn.eps,
        )  # fmt: skip
        # the leaves' outputs are rounded (BatchNorm, Identity), not the product in _Gained's
        # own forward
        want = _half(h, dtype) * _half(net[1].gain, dtype)
    assert torch.equal(run_half_storage(_engine(net), x, dtype), want)
    assert all(torch.equal(t, before[n]) for n, t in net.state_dict().items())
