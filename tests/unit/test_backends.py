"""The FP8 product backends' registry (`quant/backends/`): what the two built-in backends
declare, and a fourth backend registered here, in this file alone, reaching the command line's
choices, the build spec, the engine's record and the per-layer kernel choice."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from quantstudy.quant import backends
from quantstudy.quant.backends.base import Alignment, Backend, Product, Support
from quantstudy.quant.backends.scaled_mm import ScaledMMBackend
from quantstudy.record import KernelChoice
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Activation, Epilogue, ProductOp

CPU = torch.device("cpu")


class Fake(ScaledMMBackend):
    """A fourth backend: torch._scaled_mm's layer under another name (its arithmetic is not
    what this test is about), declared as any backend module would declare itself."""

    name = "fake"
    summary = "a backend registered by a test"
    support = Support(
        ops=frozenset({ProductOp.LINEAR, ProductOp.CONV1X1}),
        epilogues=frozenset({Epilogue.BIAS}),
        out_dtypes=frozenset({"float16", "bfloat16", "float32"}),
        alignment=Alignment(k=16, n=16),
    )


@pytest.fixture
def fake():
    backend = backends.register(Fake())
    yield backend
    backends.unregister(backend.name)


def test_the_built_in_backends_declare_what_they_run():
    assert backends.names() == ["fused", "cublaslt", "scaled_mm"]  # the default first
    assert backends.options() == ["fused", "cublaslt", "scaled_mm", "fastest"]
    fused, scaled = backends.get("fused"), backends.get("scaled_mm")
    assert fused.support.ops == frozenset(ProductOp) and scaled.support.ops == {
        ProductOp.LINEAR, ProductOp.CONV1X1}  # fmt: skip
    assert fused.support.takes(Epilogue.ACTIVATION, Activation.GELU)
    assert not scaled.support.takes(Epilogue.ACTIVATION, Activation.GELU)
    assert not scaled.support.takes(Epilogue.FP8_OUTPUT) and scaled.support.takes(Epilogue.BIAS)
    assert scaled.blocker(nn.Conv2d(16, 16, 3)) == "kernel 3x3 has no FP8 conv kernel"
    assert fused.blocker(nn.Conv2d(16, 16, 3)) is None and fused.blocker(nn.Linear(5, 3)) is None
    # fused and scaled_mm run on the CPU too; cuBLASLt says in one line why it does not
    available = backends.available()
    assert available["fused"] == available["scaled_mm"] == (True, "")
    if not torch.cuda.is_available():
        ok, why = available["cublaslt"]
        assert not ok and "CUDA" in why and "\n" not in why
    with pytest.raises(UserError, match="no FP8 backend 'cublas'; the backends are fused"):
        backends.get("cublas")


def test_alignment_refuses_only_where_the_backend_does_not_pad():
    strict = Alignment(k=16, n=16, pads=False)
    assert strict.missed(32, 48) is None and "multiples of 16" in strict.missed(24, 48)
    assert Alignment(k=16, n=16).missed(24, 40) is None  # padded with exact zeros


def test_an_unavailable_backend_says_why_in_one_line(monkeypatch):
    """A backend that needs what this machine lacks answers, it does not raise."""

    class Absent(Fake):
        name = "absent"

        def availability(self):
            return False, "needs a CUDA GPU"

    backends.register(Absent())
    try:
        assert backends.available()["absent"] == (False, "needs a CUDA GPU")
        assert "absent" not in backends.usable() and "absent" in backends.options()
    finally:
        backends.unregister("absent")


def test_listing_the_backends_imports_no_torch():
    code = (
        "import sys; from quantstudy.quant import backends; backends.options(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_another_backend_reaches_the_command_line_and_the_spec(fake):
    from quantstudy.cli import _parser
    from quantstudy.record import StudyConfig

    run = _parser()._subparsers._group_actions[0].choices["run"]
    kernel = next(a for a in run._actions if a.dest == "fp8_kernel")
    assert kernel.choices == ["fused", "cublaslt", "fake", "scaled_mm", "fastest"]
    config = StudyConfig(model="m", data="d", fp8_kernel="fake")
    assert config.build_spec(switches={}).backend == "fake"
    backends.check_option("fake")
    backends.unregister("fake")
    with pytest.raises(
        UserError, match="--fp8-kernel must be fused, cublaslt, scaled_mm or fastest, not"
    ):
        backends.check_option("fake")
    backends.register(fake)


def _net_and_plan():
    from quantstudy.quant.calibration.calibrate import calibrate
    from quantstudy.quant.plan.apply import QuantPlan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), nn.Conv2d(32, 16, 1)).eval()
    x = torch.randn(2, 16, 4, 4)
    return model, x, QuantPlan(["0", "2"], True, calibrate(model, ["0", "2"], [x]))


def test_a_fourth_backend_builds_an_engine_and_its_record(fake):
    from quantstudy.engines.builders import build_fp8

    model, x, plan = _net_and_plan()
    engine = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="fake"))
    layout = engine.info().layout
    assert layout.kernel == "fake" and layout.kernel_option == "fake"
    assert engine.info().fp8_real == ["0", "2"] and layout.handoff == {}  # it writes no FP8
    with torch.no_grad():
        scaled = build_fp8(
            model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="scaled_mm")
        )
        assert torch.equal(engine(x), scaled(x))  # the same layer under another name


def test_the_kernel_choice_times_and_picks_a_fourth_backend(fake, monkeypatch, tmp_path):
    """With a stand-in clock the fourth backend is the fastest of each 1x1 layer: the choice
    names it, the record keeps every backend's time by name, and the engine runs it."""
    from quantstudy.engines import kernel_choice
    from quantstudy.engines.builders import build_fp8
    from quantstudy.engines.unfused import Unfused
    from quantstudy.quant.layers.matmul import FP8Matmul

    # per layer, in `time_layer`'s order: the shared quantize, then the FP8 sides (the base
    # backend, then the others in the registry's order), then the float layer
    times = {"quantize": 0.0, "fused": 10.0, "fake": 2.0, "scaled_mm": 9.0, "fp16": 100.0}
    order = iter(list(times.values()) * 2)
    monkeypatch.setattr(kernel_choice, "cache_path", lambda: tmp_path / "choice.json")
    model, x, plan = _net_and_plan()
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.timed([2]))
    engine = build_fp8(
        model, CPU, x, plan, dtype=torch.float32, spec=spec, timer=lambda fn: next(order)
    )
    rows = engine.info().layout.kernel_choice
    assert [r.kernel for r in rows] == ["fake", "fake"]
    timed = {k: v for k, v in times.items() if k != "quantize"}
    assert all(r.us == timed for r in rows)
    for name in ("0", "2"):
        layer = engine.eager.get_submodule(name)
        assert isinstance(layer, Unfused) and isinstance(layer.layer, FP8Matmul)
    again = build_fp8(
        model, CPU, x, plan, dtype=torch.float32,
        spec=BuildSpec(kernel="fastest", choice=KernelChoice.replayed(rows)),
    )  # fmt: skip
    assert again.info().layout.kernel_choice == rows  # replayed, nothing timed


def test_a_product_launch_refuses_an_epilogue_the_backend_lacks():
    xq = torch.zeros(4, 16).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    product = Product(xq, xq, one, one, None, torch.float32, act=Activation.GELU)
    with pytest.raises(ValueError, match="no activation"):
        backends.get("scaled_mm").launch(product)


def test_a_backend_must_implement_what_it_declares():
    class Half(Backend):
        name = "half"

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_a_fourth_backend_reaches_the_benches(fake, monkeypatch):
    """`bench peers --ours` and `bench speed --kernels` take its name; `bench products` times
    its launch under its `bench_label`, plain and with each engine epilogue it computes (here
    only the rounding to fp16 where the unfused engine stores: no activation, no FP8 output)."""
    from quantstudy.bench.arg_types import kernels, ours
    from quantstudy.bench.product_columns import registered_columns

    assert ours("fake,fastest") == ("fake", "fastest") and kernels("fake") == ("fake",)
    monkeypatch.setattr(Fake, "bench_label", "fake-lt")
    g = torch.Generator().manual_seed(0)
    xq = torch.randn(32, 32, generator=g).to(torch.float8_e4m3fn)
    w8 = torch.randn(16, 32, generator=g).to(torch.float8_e4m3fn)
    one, bias = torch.tensor(1.0), torch.zeros(16)
    calls = registered_columns(Product(xq, w8, one, one, bias, torch.float32))
    assert list(calls) == ["fake-lt", "fake-lt fp16-rounds"]
    want = xq.float() @ w8.float().t()  # exact FP8 products; the column writes fp16 (11 bits)
    assert torch.allclose(calls["fake-lt"]().float(), want, rtol=2**-10, atol=2**-10)
