"""Residual sums in the fused FP8 layer's epilogue (`quant/rewrites/residual.py`), on the CPU."""

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fp8, deployed_copy
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.rewrites.residual import residual_sites
from quantstudy.record.build_spec import BuildSpec
from tests.unit._interpreter import require_triton, run_interpreted

CPU = torch.device("cpu")


class _Bottleneck(nn.Module):
    """ResNet's ending: conv3 -> BN -> in-place += shortcut (a downsample conv) -> ReLU, the
    ReLU module called twice in the block."""

    def __init__(self, c: int, down: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, 32, 1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 16, 1)
        self.bn3 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.down = nn.Sequential(nn.Conv2d(c, 16, 1), nn.BatchNorm2d(16)) if down else None

    def forward(self, x):
        shortcut = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn3(self.conv3(out))
        if self.down is not None:
            shortcut = self.down(x)
        out += shortcut
        return self.relu(out)


class _Inverted(nn.Module):
    """An inverted residual: the projection plus the block input, no activation after, a
    dropout (eval) between."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(16, 48, 1)
        self.act = nn.ReLU6()
        self.pwl = nn.Conv2d(48, 16, 1)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.pwl(self.act(self.pw(x)))) + x


class _TwoReaders(nn.Module):
    """The layer's output is read twice: the sum cannot move into it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = self.conv(x)
        return y + x + y.mean((2, 3), keepdim=True)


class _ShortcutInPlace(nn.Module):
    """`s += conv(x)` changes the block input in place, which a traced graph does not: the
    rewrite would change the output, and the check must refuse it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        s = x
        s += self.conv(x)
        return s + x


class _ConcatOther(nn.Module):
    """The other term is a concatenation only the add reads (ghostnet's ghost module): the
    compiled engine would compute it inside the add, so the layer does not take it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)
        self.a, self.b = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], 1) + self.conv(x)


class _CalledTwice(nn.Module):
    """One layer called twice, once into an add: a residual at one call only cannot be."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return self.conv(self.conv(x)) + x


class _Broadcast(nn.Module):
    """Adds that broadcast: a per-channel vector onto the layer's output, and the layer's
    pooled output onto the block input. The fused layer writes its own output's shape, so
    neither moves into it (the check's float copy refuses other shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)
        self.gate = nn.Conv2d(16, 16, 1)
        self.squeeze = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = self.conv(x) + self.gate(x.mean((2, 3), keepdim=True))
        return self.squeeze(y.mean((2, 3), keepdim=True)) + y


class _Branchy(nn.Module):
    """Data-dependent control flow: untraceable, so no site (and no error)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = self.conv(x)
        return y + x if x.sum() > 0 else y - x


class _Net(nn.Module):
    def __init__(self, tail: nn.Module) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.Sequential(_Bottleneck(16, True), _Bottleneck(16, False), _Inverted())
        self.tail = tail

    def forward(self, x):
        return self.tail(self.blocks(self.stem(x)))


def _setup(tail: nn.Module | None = None):
    torch.manual_seed(0)
    model = _Net(tail or nn.Identity()).eval()
    for m in model.modules():  # non-trivial BatchNorms (not the zero-init of residual ends)
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.normal_(m.bias, 0, 0.2)
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, 8)
    layers = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "stem"]
    return model, x, QuantPlan(layers, True, calibrate(model, layers, [x]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_sums_move_into_the_layer_and_change_no_number(dtype):
    """conv3 takes its block's sum and ReLU (once per add, not the downsample conv that feeds
    the same add), pwl its sum without activation; the engine's output is bit-identical to
    the engine that adds in a separate pass, in float32 and in bf16 (the epilogue rounds both
    terms and the sum where the separate pass stores them)."""
    model, x, plan = _setup()
    fused = build_fp8(model, CPU, x, plan, dtype=dtype)
    apart = build_fp8(model, CPU, x, plan, dtype=dtype, spec=BuildSpec(residual=False))
    assert fused.info().layout.residual == {
        "blocks.0.conv3": "relu", "blocks.1.conv3": "relu", "blocks.2.pwl": "none",
    }  # fmt: skip
    assert apart.info().layout.residual == {}
    conv3 = fused.eager.get_submodule("blocks.0.conv3")
    assert isinstance(conv3, FusedFP8Matmul) and conv3.res_act == "relu"
    assert "residual" in repr(conv3)
    with torch.no_grad():
        got, want = fused.eager(fused.prepare(x)), apart.eager(apart.prepare(x))
    assert torch.equal(got, want)
    assert not torch.equal(got, fused.eager(fused.prepare(x.flip(0))))  # the input matters


KEEP_THEIR_ADD = [_TwoReaders, _ShortcutInPlace, _ConcatOther, _CalledTwice, _Broadcast, _Branchy]


@pytest.mark.parametrize("tail", KEEP_THEIR_ADD)
def test_no_site_where_the_sum_cannot_move(tail):
    """A second reader, an in-place shortcut the traced graph would not reproduce (refused by
    the bit-exact check), an other term stored only for the layer, a layer called twice,
    broadcast adds, untraceable control flow: the tail's layers keep their adds."""
    model, x, plan = _setup(nn.Sequential(tail()))
    found = residual_sites(deployed_copy(model, x, fold=True), plan.layers, x)
    assert not any(name.startswith("tail.") for name in found)
    assert set(found) == {"blocks.0.conv3", "blocks.1.conv3", "blocks.2.pwl"}
    engine = build_fp8(model, CPU, x, plan, dtype=torch.float32)
    apart = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(residual=False))
    with torch.no_grad():
        assert torch.equal(engine.eager(x), apart.eager(x))


def test_a_layer_without_its_residual_is_refused():
    model, x, plan = _setup()
    layer = build_fp8(model, CPU, x, plan, dtype=torch.float32).eager.get_submodule("blocks.2.pwl")
    with pytest.raises(ValueError, match="takes its residual"):
        layer(torch.randn(2, 48, 8, 8))


def test_kernel_residual_sum_under_the_interpreter_matches_the_torch_path():
    """The Triton epilogue's residual sum (a strided residual, both activations, fp16
    rounding) equals the op's torch path under Triton's interpreter; with the pointer and the
    descriptor store."""
    require_triton()
    (same,) = run_interpreted(
        """
        import torch
        from quantstudy.quant.layers.fused_matmul import fp8_gemm
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(3)
        m, k, n = 80, 32, 48
        xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(n, generator=g) / 7 + 0.01, torch.tensor(0.37)
        b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
        r = (torch.randn(n, m, generator=g) * 4).half().t()  # strided: column-major
        same = 1.0
        for act, res_act, store in [("relu6", "relu", "pointer"), ("none", "none", "tma")]:
            args = (xq, w8, ws, xs, b, act, torch.float16)
            y = fp8_gemm_triton(*args, (32, 32, 32), store=store, round_to=torch.float16,
                                residual=r, res_act=res_act).float()
            ref = fp8_gemm(*args, None, torch.float16, r, res_act).float()
            same = min(same, (y == ref).float().mean().item())
        print(same)
        """
    )
    assert float(same) > 0.999


def test_kernel_choice_times_and_swaps_residual_layers_with_their_sum(tmp_path):
    """Stand-in times that make scaled_mm win everywhere: the residual layers become the
    unfused layer followed by the add and the activation after it, timed with their residual
    (both layers refuse to run without it); the engine computes what the fused one did."""
    from itertools import cycle

    from quantstudy.engines.kernel_choice import choose_kernels
    from quantstudy.engines.unfused import Unfused

    model, x, plan = _setup()
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32).eager
    with torch.no_grad():
        want = m(x)
    seen = []

    def timer(fn):
        seen.append(fn)
        return next(times)

    times = cycle([1.0, 10.0, 2.0, 100.0])  # quantize, fused, unfused, float (loses)
    source = deployed_copy(model, x, fold=True)  # what build_fp8 builds both layers from
    got = choose_kernels(m, source, plan, torch.float32, x, CPU, 2, tmp_path / "c.json", timer)
    handed = {"blocks.2.pw", "blocks.2.pwl"}  # an FP8 hand-off: no unfused counterpart
    assert {c.name for c in got if c.kernel == "scaled_mm"} == set(plan.layers) - handed
    conv3 = m.get_submodule("blocks.0.conv3")
    assert isinstance(conv3, Unfused) and isinstance(conv3.res_act, nn.ReLU)
    assert m.get_submodule("blocks.0.conv1").res_act is None
    pwl = m.get_submodule("blocks.2.pwl")  # reads its FP8 input and sums its residual
    assert isinstance(pwl, FusedFP8Matmul) and pwl.fp8_input and pwl.res_act == "none"
    with torch.no_grad():
        assert torch.allclose(m(x), want, rtol=1e-5, atol=1e-6)
    # three layer shapes timed four ways (equal ones share a cache entry); a residual layer
    # timed without its residual would have raised
    assert len(seen) == 3 * 4
