"""Per-layer kernel choice (`engines/kernel_choice.py`) on CPU, with a stand-in timer."""

import json

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.engines.kernel_choice import ByBatch, choose_kernels, nearest_batch
from quantstudy.engines.unfused import Unfused
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.matmul import FP8Matmul
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import KernelChoice
from quantstudy.record.build_spec import BuildSpec

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _timing_cache(monkeypatch, tmp_path):
    """The engines' timing cache (`kernel_choice.cache_path`, beside Inductor's) in the test's
    folder: a build with a stand-in clock times afresh and leaves nothing for the next test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k3 = nn.Conv2d(3, 16, 3, padding=1)
        self.pw = nn.Conv2d(16, 32, 1)
        self.act = nn.ReLU()
        self.proj = nn.Conv2d(32, 16, 1)
        self.fc1 = nn.Linear(16, 64)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        k = self.k3(x)
        z = self.act(self.pw(k))
        x = self.proj(z) + k + z[:, :16]  # two readers each: no FP8 hand-off around pw
        return self.fc2(self.gelu(self.fc1(x.mean((2, 3)))))


def _setup():
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 8, 8)
    layers = ["k3", "pw", "proj", "fc1", "fc2"]
    return model, x, QuantPlan(layers, True, calibrate(model, layers, [x]))


def test_off_cuda_nothing_is_timed_and_every_layer_stays_fused():
    model, x, plan = _setup()
    engine = build_fp8(
        model,
        CPU,
        x,
        plan,
        dtype=torch.float32,
        spec=BuildSpec(kernel="fastest", choice=KernelChoice.timed([128])),
    )
    info = engine.info()
    assert info.layout.kernel_option == "fastest"
    assert [(c.name, c.kernel, c.why) for c in info.layout.kernel_choice] == [
        (n, "fused", "not timed off CUDA") for n in plan.layers
    ]


def test_faster_scaled_mm_replaces_the_fused_layer_with_its_activation_after(tmp_path):
    """Stand-in times: per timed layer the shared input quantize, the fused forward, the
    unfused one (1x1/linear layers only), then the float layer, which loses everywhere here;
    the quantize is subtracted from both FP8 sides. `pw` (ReLU absorbed) loses to scaled_mm
    by 50%, `proj` by 1% (inside the margin: stays fused); the 3x3 conv has no unfused kernel
    (fused against fp16 only); the MLP pair hands FP8 over: not timed. The swapped engine
    computes what the fused one did."""
    model, x, plan = _setup()
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")).eager
    with torch.no_grad():
        want = m(x)
    times = iter([1.0, 11.0, 100.0, 2.0, 12.0, 7.0, 100.0, 3.0, 13.0, 12.9, 100.0])
    cache = tmp_path / "choice.json"
    got = choose_kernels(m, model, plan, torch.float32, x, CPU, 4, cache, lambda fn: next(times))
    by_name = {c.name: c for c in got}
    assert by_name["pw"].kernel == "scaled_mm" and by_name["pw"].batch == 4
    assert (by_name["pw"].fused_us, by_name["pw"].scaled_mm_us) == (10.0, 5.0)
    assert by_name["proj"].kernel == "fused"
    assert (by_name["proj"].fused_us, by_name["proj"].scaled_mm_us) == (10.0, 9.9)
    k3 = by_name["k3"]
    assert (k3.kernel, k3.fused_us, k3.scaled_mm_us, k3.fp16_us, k3.why) == (
        "fused", 10.0, None, 100.0, None
    )  # fmt: skip
    assert by_name["fc1"].why == by_name["fc2"].why == "FP8 hand-off"
    assert isinstance(m.pw, Unfused) and isinstance(m.pw.layer, FP8Matmul)
    assert isinstance(m.pw.act, nn.ReLU) and m.pw.res_act is None
    assert isinstance(m.proj, FusedFP8Matmul) and isinstance(m.k3, FusedFP8Conv2d)
    with torch.no_grad():
        assert torch.allclose(m(x), want, rtol=1e-5, atol=1e-6)
    assert len(json.loads(cache.read_text())) == 3
    # a rebuilt engine reads the cache: the timer is not called again
    m2 = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")).eager
    again = choose_kernels(m2, model, plan, torch.float32, x, CPU, 4, cache, lambda fn: 1 / 0)
    assert again == got


def test_the_choice_is_made_per_batch_and_a_split_layer_runs_both_by_batch(tmp_path):
    """Stand-in times at batches 1 and 4 (per timed layer: quantize, fused, unfused, float;
    the 3x3 conv has no unfused kernel, the float layers lose): `pw` loses to scaled_mm at
    batch 1 only, `proj` at batch 4 only. Each becomes a `ByBatch` pair
    that runs scaled_mm at its winning batch, one record per layer and batch; the engine
    computes what the fused one did at both sizes, and an untimed batch takes the nearest."""
    model, x, plan = _setup()
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")).eager
    x4 = x.repeat(2, 1, 1, 1)
    with torch.no_grad():
        want1, want4 = m(x[:1]), m(x4)
    k3, slow = [1.0, 11.0, 100.0], 100.0
    times = iter([*k3, 2.0, 12.0, 7.0, slow, 3.0, 13.0, 12.9, slow,
                  *k3, 2.0, 7.0, 12.0, slow, 1.0, 11.0, 4.0, slow])  # fmt: skip
    got = choose_kernels(
        m, model, plan, torch.float32, x, CPU, [4, 1], tmp_path / "c.json", lambda fn: next(times)
    )
    rows = {
        (c.name, c.batch): (c.kernel, c.fused_us, c.scaled_mm_us)
        for c in got
        if c.batch and c.name != "k3"
    }
    assert rows == {
        ("pw", 1): ("scaled_mm", 10.0, 5.0), ("proj", 1): ("fused", 10.0, 9.9),
        ("pw", 4): ("fused", 5.0, 10.0), ("proj", 4): ("scaled_mm", 10.0, 3.0),
    }  # fmt: skip
    assert isinstance(m.pw, ByBatch) and isinstance(m.proj, ByBatch)
    assert m.pw.picks == {1: "scaled_mm", 4: "fused"}
    assert m.proj.picks == {1: "fused", 4: "scaled_mm"}
    pw = m.pw.backends
    assert isinstance(pw["fused"], FusedFP8Matmul) and isinstance(pw["scaled_mm"].layer, FP8Matmul)
    with torch.no_grad():
        assert torch.allclose(m(x[:1]), want1, rtol=1e-5, atol=1e-6)
        assert torch.allclose(m(x4), want4, rtol=1e-5, atol=1e-6)
    assert [nearest_batch(b, [1, 4]) for b in (1, 2, 3, 8, 128)] == [1, 4, 4, 4, 4]
    assert nearest_batch(8, [1, 128]) == 1 and nearest_batch(16, [1, 128]) == 128


def test_a_depthwise_layer_without_hand_offs_is_timed_against_its_float_layer(tmp_path):
    """A real FP8 depthwise conv between fp16 layers (no hand-off on either side) has no
    unfused counterpart: it is timed against its float layer only (equal times: it stays
    fused), and the hand-off test that lets it be timed does not ask it for a 1x1 layer's
    attribute."""
    from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1, groups=16)
    )
    model.eval()
    x = torch.randn(2, 3, 8, 8)
    plan = QuantPlan(["1"], True, calibrate(model, ["1"], [x]))
    m = build_fp8(model, CPU, x, plan, dtype=torch.float32).eager
    dw = m.get_submodule("1")
    assert isinstance(dw, FusedFP8Depthwise) and not dw.fp8_input and dw.out_scale is None
    got = choose_kernels(
        m, model, plan, torch.float32, x, CPU, 2, tmp_path / "c.json", lambda f: 1.0
    )
    assert [(c.name, c.kernel, c.batch, c.scaled_mm_us, c.fp16_us) for c in got] == [
        ("1", "fused", 2, None, 1.0)
    ]


def _screen_timer(fc1_mm: float, fc2_mm: float):
    """Stand-in times of the screen assembly at one batch, in forward order, per layer: the
    shared quantize (0), fused, scaled_mm (1x1 and linear layers), fp16 (slow): k3 and the
    1x1 convs level, fc1 and fc2 as given against the fused 10."""
    times = iter([0.0, 10.0, 100.0, *(0.0, 10.0, 10.0, 100.0) * 2,
                  0.0, 10.0, fc1_mm, 100.0, 0.0, 10.0, fc2_mm, 100.0])  # fmt: skip
    return lambda fn: next(times)


def test_a_hand_off_is_given_up_where_both_its_layers_run_scaled_mm_faster():
    """fc1 hands its GELU output to fc2 in FP8 in the fused engine. Timed where no layer hands
    off, both run torch._scaled_mm faster: the engine gives the hand-off up, so each runs
    scaled_mm (fc1's GELU after it, fc2 quantizing its own input), says why, and computes what
    the fused engine computes; replayed, the recorded choice builds the same engine untimed."""
    model, x, plan = _setup()
    fused = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=BuildSpec(kernel="fused"))
    assert fused.info().layout.handoff == {"fc1": "fc2"}
    engine = build_fp8(
        model,
        CPU,
        x,
        plan,
        dtype=torch.float32,
        spec=BuildSpec(kernel="fastest", choice=KernelChoice.timed([4])),
        timer=_screen_timer(4.0, 5.0),
    )
    layout = engine.info().layout
    assert layout.handoff == {}
    rows = {c.name: (str(c.kernel), c.why) for c in layout.kernel_choice}
    assert rows["fc1"] == (
        "scaled_mm",
        "writes fc2's input in fp16, not FP8: both run scaled_mm faster",
    )
    assert rows["fc2"] == (
        "scaled_mm",
        "reads fc1's output in fp16, not FP8: both run scaled_mm faster",
    )
    m = engine.eager
    assert isinstance(m.fc1, Unfused) and isinstance(m.fc1.layer, FP8Matmul)
    assert isinstance(m.fc1.act, nn.GELU) and isinstance(m.fc2, Unfused)
    with torch.no_grad():
        assert torch.allclose(m(x), fused.eager(x), rtol=1e-5, atol=1e-6)
    again = build_fp8(
        model,
        CPU,
        x,
        plan,
        dtype=torch.float32,
        spec=BuildSpec(kernel="fastest", choice=KernelChoice.replayed(layout.kernel_choice)),
        timer=lambda fn: 1 / 0,
    )
    assert (
        again.info().layout.handoff == {}
        and again.info().layout.kernel_choice == layout.kernel_choice
    )
    assert isinstance(again.eager.fc1, Unfused) and isinstance(again.eager.fc2, Unfused)


def test_a_hand_off_stays_where_only_one_of_its_layers_runs_scaled_mm_faster():
    """fc1 is faster with scaled_mm, fc2 is not (inside the margin): the hand-off stays and
    both run fused, fc1 with why."""
    model, x, plan = _setup()
    engine = build_fp8(
        model,
        CPU,
        x,
        plan,
        dtype=torch.float32,
        spec=BuildSpec(kernel="fastest", choice=KernelChoice.timed([4])),
        timer=_screen_timer(4.0, 9.9),
    )
    layout = engine.info().layout
    assert layout.handoff == {"fc1": "fc2"}
    rows = {c.name: (str(c.kernel), c.why) for c in layout.kernel_choice}
    assert rows["fc1"] == ("fused", "FP8 hand-off: runs fused (timed alone, without it)")
    assert rows["fc2"][0] == "fused"
    assert isinstance(engine.eager.fc1, FusedFP8Matmul) and isinstance(
        engine.eager.fc2, FusedFP8Matmul
    )


def test_a_chain_gives_up_only_hand_offs_whose_layers_are_free_of_the_kept_ones():
    """a -> b -> c hand off in turn. With c fused, b stays tied to c's hand-off (fused), so a's
    hand-off to b is kept too; with all three on scaled_mm both are given up."""
    from quantstudy.engines.kernel_choice import scaled_mm_pairs
    from quantstudy.record import LayerKernel

    def rows(scaled: str) -> list[LayerKernel]:
        kernel = {n: "scaled_mm" if n in scaled else "fused" for n in "abc"}
        return [LayerKernel(name=n, kernel=kernel[n], fused_us=1.0, batch=b) for n in "abc"
                for b in (1, 128)]  # fmt: skip

    chain = {"a": "b", "b": "c"}
    assert scaled_mm_pairs(rows("ab"), chain) == {}
    assert scaled_mm_pairs(rows("abc"), chain) == chain
    assert scaled_mm_pairs(rows("bc"), chain) == {}  # a's hand-off to b ties b
    split = [*rows("abc")[:-1], LayerKernel(name="c", kernel="fused", fused_us=1.0, batch=128)]
    assert scaled_mm_pairs(split, chain) == {}  # c runs scaled_mm at batch 1 only: fused, tied


def test_a_hand_off_stays_where_a_layer_runs_a_backend_made_from_the_fused_layer():
    """cuBLASLt's layer takes the fused layer's state, hand-offs included: a hand-off with a
    cuBLASLt layer on either side is kept (that layer runs cuBLASLt with it, `settled`;
    tests/unit/test_gelu_forms.py builds one), where two scaled_mm layers give theirs up."""
    from quantstudy.engines.kernel_choice import scaled_mm_pairs
    from quantstudy.record import LayerKernel

    def rows(kernels: dict[str, str]) -> list[LayerKernel]:
        return [LayerKernel(name=n, kernel=k, fused_us=1.0, batch=4) for n, k in kernels.items()]

    assert scaled_mm_pairs(rows({"a": "scaled_mm", "b": "scaled_mm"}), {"a": "b"}) == {"a": "b"}
    assert scaled_mm_pairs(rows({"a": "cublaslt", "b": "cublaslt"}), {"a": "b"}) == {}
    assert scaled_mm_pairs(rows({"a": "cublaslt", "b": "scaled_mm"}), {"a": "b"}) == {}


def test_a_backend_that_refuses_a_layer_is_not_timed_for_it(tmp_path):
    """A usable backend whose blocker refuses every layer adds no candidate: the stand-in
    timer is called exactly as without it (the sequence of the test above), and no row holds
    a time under its name (it would time a fused layer under that name otherwise)."""
    from quantstudy.quant import backends
    from quantstudy.quant.backends.scaled_mm import ScaledMMBackend

    class Refusing(ScaledMMBackend):
        name = "refusing"

        def blocker(self, layer: nn.Module) -> str | None:
            return "refuses every layer"

    backends.register(refusing := Refusing())
    try:
        model, x, plan = _setup()
        spec = BuildSpec(kernel="fused")
        m = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=spec).eager
        times = iter([1.0, 11.0, 100.0, 2.0, 12.0, 7.0, 100.0, 3.0, 13.0, 12.9, 100.0])
        got = choose_kernels(
            m, model, plan, torch.float32, x, CPU, 4, tmp_path / "c.json", lambda fn: next(times)
        )
        assert next(times, None) is None  # every stand-in time used, none more asked for
        assert all(refusing.name not in c.us for c in got)
        assert {c.name: c.kernel for c in got}["pw"] == "scaled_mm"
    finally:
        backends.unregister(refusing.name)


def test_a_layer_runs_one_epilogue_arithmetic_at_every_batch():
    """Where cuBLASLt (its own epilogue: tanh GELU) wins one batch and the fused kernel (erf)
    another, the layer takes the backend of least summed time at every batch, so its one GELU
    form in the record holds at each; fused against scaled_mm, which compute the same epilogue,
    stay split by batch."""
    from quantstudy.engines.kernel_choice import Timing, layer_rows

    mixed = {
        1: Timing({"fused": 10.0, "cublaslt": 8.0}),
        128: Timing({"fused": 100.0, "cublaslt": 120.0}),
    }
    assert {r.kernel for r in layer_rows("fc1", mixed)} == {"fused"}  # 110 us against 128 us
    # cuBLASLt far ahead at batch 1, level at 128: 105 us against 149 us in all
    faster = {
        1: Timing({"fused": 50.0, "cublaslt": 5.0}),
        128: Timing({"fused": 99.0, "cublaslt": 100.0}),
    }
    assert [r.kernel for r in layer_rows("fc1", faster)] == ["cublaslt", "cublaslt"]
    # ahead in all by less than the margin: the engine as assembled
    level = {
        1: Timing({"fused": 10.0, "cublaslt": 8.0}),
        128: Timing({"fused": 100.0, "cublaslt": 101.0}),
    }
    assert [r.kernel for r in layer_rows("fc1", level)] == ["fused", "fused"]
    split = {
        1: Timing({"fused": 10.0, "scaled_mm": 8.0}),
        128: Timing({"fused": 100.0, "scaled_mm": 120.0}),
    }
    assert [r.kernel for r in layer_rows("fc1", split)] == ["scaled_mm", "fused"]
