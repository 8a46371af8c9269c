"""A "fastest" FP8 engine keeps a layer in fp16 where FP8 is slower at every timed batch
(`engines/step_aside.py`), on CPU with stand-in timers."""

import types

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fakequant, build_fp8, build_half
from quantstudy.engines.unfused import Unfused
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import EngineInfo, FP8Layout, KernelChoice, LayerKernel, StudyConfig
from quantstudy.record.build_spec import BuildSpec

CPU = torch.device("cpu")
SLOW = 100.0


@pytest.fixture(autouse=True)
def _timing_cache(monkeypatch, tmp_path):
    """The engines' timing cache (`kernel_choice.cache_path`) in the test's folder: each test
    times afresh, and nothing is written under the user's home."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


class _Res(nn.Module):
    """A resnet-like block: a 3x3 stem read twice (no hand-off), a 1x1 conv whose output only a
    zero pad reads (it writes the padded output, `quant/rewrites/pad_handoff.py`), a 3x3 conv
    with padding 0 after that pad, a 3x3 conv summed with its input, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.act0 = nn.ReLU()
        self.pw = nn.Conv2d(16, 16, 1)
        self.act1 = nn.ReLU()
        self.pad = nn.ZeroPad2d(1)
        self.k3 = nn.Conv2d(16, 16, 3)
        self.k3b = nn.Conv2d(16, 16, 3, padding=1)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.act0(self.stem(x))
        y = self.k3(self.pad(self.act1(self.pw(s))))
        z = self.act2(self.k3b(y) + y + s)
        return self.head(z.mean((2, 3)))


def _setup(layers=("stem", "pw", "k3", "k3b", "head")):
    torch.manual_seed(0)
    model = _Res().eval()
    x = torch.randn(2, 3, 8, 8)
    return model, x, QuantPlan(list(layers), True, calibrate(model, list(layers), [x]))


# the layers timed, in forward order, and whether each has an unfused scaled_mm counterpart
# (1x1/linear): all of them, `pw` too, which writes a padded output in the engine but is timed
# where no layer hands off (`engines/fp8_assembly.py`)
TIMED = [("stem", False), ("pw", True), ("k3", False), ("k3b", False), ("head", True)]


def _timer(table: dict[int, dict[str, tuple[float, float | None, float]]], layers=None):
    """A stand-in timer fed in the order the pass times: per batch (ascending) and timed layer,
    the shared quantize (0 here, so the FP8 times are as given), fused, scaled_mm (1x1/linear
    layers only), fp16; a layer the table leaves out takes the fused product, fp16 slower.
    `layers`: the plan's, where it leaves some of `TIMED` out."""
    times = []
    for batch in sorted(table):
        for name, matmul in [(n, mm) for n, mm in TIMED if layers is None or n in layers]:
            fused, mm, fp16 = table[batch].get(name, (10.0, 10.0 if matmul else None, SLOW))
            times += [0.0, fused, *([mm] if matmul else []), fp16]
    it = iter(times)
    return lambda fn: next(it)


def _fastest(model, x, plan, table):
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.timed(sorted(table)))
    return build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=spec, timer=_timer(table))


def test_a_layer_steps_aside_only_where_fp16_wins_at_every_timed_batch():
    """At batches 1 and 4: `stem`'s float conv wins at both (steps aside); `k3`'s wins at batch
    1 only (stays FP8, its fp16 times recorded); `k3b`'s is faster at both but within the
    margin at batch 4 (stays); `head`'s beats the fused product at both but not scaled_mm,
    which is its best FP8 kernel (stays FP8, running scaled_mm). The pad-writing 1x1 conv,
    timed alone, stays FP8 and fused in the engine, where it writes the padded output, with its
    reason."""
    model, x, plan = _setup()
    table = {
        b: {"stem": (10.0, None, 5.0), "k3": (10.0, None, 5.0 if b == 1 else 11.0),
            "k3b": (10.0, None, 9.0 if b == 1 else 9.8), "head": (10.0, 4.0, 6.0)}
        for b in (1, 4)
    }  # fmt: skip
    engine = _fastest(model, x, plan, table)
    info = engine.info()
    rows = {(c.name, c.batch): (str(c.kernel), c.fp16_us) for c in info.layout.kernel_choice}
    assert rows == {
        ("stem", 1): ("fp16", 5.0), ("stem", 4): ("fp16", 5.0),
        ("pw", 1): ("fused", SLOW), ("pw", 4): ("fused", SLOW),
        ("k3", 1): ("fused", 5.0), ("k3", 4): ("fused", 11.0),
        ("k3b", 1): ("fused", 9.0), ("k3b", 4): ("fused", 9.8),
        ("head", 1): ("scaled_mm", 6.0), ("head", 4): ("scaled_mm", 6.0),
    }  # fmt: skip
    why = {c.name: c.why for c in info.layout.kernel_choice}
    assert why["pw"] == "writes the next conv's padded input: runs fused (timed alone, without it)"
    assert info.layout.padded_output == {"pw": "pad"}
    assert info.layout.stepped_aside == ["stem"]
    assert info.fp8_real == ["pw", "k3", "k3b", "head"]
    assert "stem" not in info.layout.epilogue and info.layout.epilogue["pw"] == "relu"
    assert info.fp16_layers == 5 - 5 + 1
    m = engine.eager
    assert isinstance(m.stem, Unfused) and type(m.stem.layer) is nn.Conv2d
    assert isinstance(m.stem.act, nn.ReLU) and m.stem.layer.weight.dtype == torch.float32
    assert isinstance(m.pw, FusedFP8Matmul) and isinstance(m.k3, FusedFP8Conv2d)


def test_a_layer_that_beats_scaled_mm_too_steps_aside_and_runs_what_the_float_model_runs():
    """`head`'s float layer beats its best FP8 kernel (scaled_mm) at both batches: it steps
    aside. With `stem` stepped aside too, the float32 engine computes, bit for bit, the model
    with only `pw`, `k3` and `k3b` quantized: its FP8 engine in float32 with those three alone."""
    model, x, plan = _setup()
    table = {
        b: {"stem": (10.0, None, 5.0), "k3": (10.0, None, SLOW), "k3b": (10.0, None, SLOW),
            "head": (10.0, 6.0, 4.0)}
        for b in (1, 4)
    }  # fmt: skip
    engine = _fastest(model, x, plan, table)
    assert engine.info().layout.stepped_aside == ["stem", "head"]
    assert type(engine.eager.head.layer) is nn.Linear
    _, _, fewer = _setup(("pw", "k3", "k3b"))
    fewer = QuantPlan(fewer.layers, True, plan.calibration)  # the same scales
    want = build_fp8(model, CPU, x, fewer, dtype=torch.float32).eager
    with torch.no_grad():
        assert torch.equal(engine.eager(x), want(x))


def test_every_layer_stepped_aside_is_the_fp16_engine_bit_for_bit():
    """Without hand-offs (no 1x1 conv in the plan), every timed layer steps aside: the FP8
    engine (bf16 on CPU) then runs the fp16 engine's layers in the same dtype, its absorbed
    activations as the same modules, and its output equals the fp16 engine's exactly."""
    model, x, plan = _setup(("stem", "k3", "k3b", "head"))
    table = {1: {"stem": (10.0, None, 1.0), "k3": (10.0, None, 1.0), "k3b": (10.0, None, 1.0),
                 "head": (10.0, 10.0, 1.0)}}  # fmt: skip
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.timed([1]))
    engine = build_fp8(model, CPU, x, plan, spec=spec, timer=_timer(table, plan.layers))
    assert engine.dtype == torch.bfloat16
    assert engine.info().layout.stepped_aside == plan.layers and engine.info().fp8_real == []
    half = build_half(model, CPU, x)
    with torch.no_grad():
        assert torch.equal(engine(x), half(x))


def test_a_conv_after_a_padded_output_steps_aside_as_the_float_conv_with_padding_0():
    """`pw` writes the zero padding `pad` would add; `k3` (padding 0 after that pad, in the
    model as in the engine) steps aside and runs the float conv on the padded buffer: in
    float32 its output equals, bit for bit, the model's `k3` on the buffer's interior padded
    by the model's own `pad` (the same zeros, so the same tensor)."""
    model, x, plan = _setup()
    table = {1: {"stem": (10.0, None, SLOW), "k3": (10.0, None, 1.0), "k3b": (10.0, None, SLOW),
                 "head": (10.0, 10.0, SLOW)}}  # fmt: skip
    engine = _fastest(model, x, plan, table)
    assert engine.info().layout.stepped_aside == ["k3"]
    seen = {}
    hook = engine.eager.k3.register_forward_hook(lambda m, a, out: seen.update(x=a[0], y=out))
    with torch.no_grad():
        engine.eager(x.contiguous(memory_format=torch.channels_last))
        hook.remove()
        padded = seen["x"]
        assert padded.shape[-2:] == (10, 10) and not padded[:, :, 0].any()
        interior = padded[:, :, 1:-1, 1:-1]
        assert torch.equal(model.k3(model.pad(interior)), seen["y"])


class _Bottleneck(nn.Module):
    """A ResNet bottleneck's first two convs: the 1x1 conv's output, after its ReLU, is read by
    the 3x3 conv alone, so in the fused engine it writes that conv's FP8 input (a hand-off)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.act1 = nn.Conv2d(8, 16, 1), nn.ReLU()
        self.conv2, self.act2 = nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act2(self.conv2(self.act1(self.conv1(x)))).mean((2, 3))


def test_a_conv_that_reads_a_hand_off_in_the_engine_may_still_step_aside():
    """The fused engine hands `conv1`'s output to `conv2` in FP8, which would tie both to FP8.
    The layers are timed where nothing is handed off, so `conv2`, slower in FP8, steps aside;
    the engine is then assembled without that hand-off, and computes, bit for bit (float32),
    the FP8 engine of the plan without `conv2`."""
    torch.manual_seed(0)
    model, x = _Bottleneck().eval(), torch.randn(2, 8, 6, 6)
    plan = QuantPlan(["conv1", "conv2"], True, calibrate(model, ["conv1", "conv2"], [x]))
    fused = build_fp8(model, CPU, x, plan, dtype=torch.float32)
    assert fused.info().layout.handoff == {"conv1": "conv2"}
    # per layer: the shared quantize, fused, scaled_mm (1x1 only), fp16
    times = iter([0.0, 10.0, 10.0, SLOW, 0.0, 10.0, 1.0])
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.timed([1]))
    engine = build_fp8(
        model, CPU, x, plan, dtype=torch.float32, spec=spec, timer=lambda fn: next(times)
    )
    info = engine.info()
    assert info.layout.stepped_aside == ["conv2"] and info.fp8_real == ["conv1"]
    assert info.layout.handoff == {} and info.layout.epilogue == {"conv1": "relu"}
    alone = QuantPlan(["conv1"], True, plan.calibration)
    want = build_fp8(model, CPU, x, alone, dtype=torch.float32).eager
    with torch.no_grad():
        assert torch.equal(engine.eager(x), want(x))


def test_the_emulations_leave_the_stepped_aside_layers_float():
    """The study's emulations are built after its FP8 engine and take the layers it stepped
    aside (here as a timed choice replayed): each is the float32 layer of the deployed model,
    not a quantize-dequantize one, and is counted as such; the others stay emulated."""
    from quantstudy.study import engines as study_engines

    model, x, plan = _setup()
    table = {1: {"stem": (10.0, None, 1.0), "k3": (10.0, None, SLOW), "k3b": (10.0, None, SLOW),
                 "head": (10.0, 10.0, 1.0)}}  # fmt: skip
    choice = _fastest(model, x, plan, table).info().layout.replay()
    config = StudyConfig(model="m", data="d", fp8_kernel="fastest", batches=[1])
    spec = config.build_spec(choice)
    builders = study_engines.study_builders(config, model, x, plan, True, CPU, spec)
    layout = builders["fp8"](FP8Layout()).info().layout
    assert layout.stepped_aside == ["stem", "head"]
    for name in ("fakequant", "fakequant_weights", "fakequant_activations"):
        emulation = builders[name](layout)
        m = emulation.eager
        assert type(m.stem) is nn.Conv2d and type(m.head) is nn.Linear
        assert all(isinstance(m.get_submodule(n), QDQ) for n in ("pw", "k3", "k3b"))
        info = emulation.info()
        assert [n for n in info.fp8_emulated] == ["pw", "k3", "k3b"]
        assert info.fp16_layers == 2
    alone = build_fakequant(model, CPU, x, plan)
    assert isinstance(alone.eager.stem, QDQ)  # an emulation built on its own emulates them all


def test_a_study_keys_the_outputs_of_its_fp8_engine_by_the_layers_kept_in_fp16(
    monkeypatch, tmp_path
):
    """The layers kept in fp16 are timed, not given by the study's inputs: a study resumed on
    another machine may keep others. So the stage cache that the FP8 engine and everything
    built after it (its emulations, the held-out chunks) read and write is keyed by them too
    (here a timed choice, replayed), while the fp32 and fp16 engines keep the study's key."""
    from quantstudy.study import quality_stage
    from quantstudy.study.cache import StageCache
    from quantstudy.study.stage_timer import StageTimer

    model, x, plan = _setup()
    table = {1: {"stem": (10.0, None, 1.0), "k3": (10.0, None, SLOW), "k3b": (10.0, None, SLOW),
                 "head": (10.0, 10.0, 1.0)}}  # fmt: skip
    choice = _fastest(model, x, plan, table).info().layout.replay()
    monkeypatch.setattr(quality_stage, "stress_inputs", lambda pre: [("x", x[0])])
    config = StudyConfig(model="m", data="d", fp8_kernel="fastest", batches=[1], eval_batch=2)
    inputs = types.SimpleNamespace(
        pre=None, recipe=types.SimpleNamespace(weights=types.SimpleNamespace(fold_bn=True)),
        loaded=types.SimpleNamespace(model=model), example=x, heldout_items=[0, 1],
    )  # fmt: skip
    cache = StageCache.keyed(tmp_path, ["a study"])
    built = quality_stage.build_engines(
        config, inputs, plan, cache, CPU, StageTimer(echo=None), config.build_spec(choice)
    )
    assert built.cache == cache.refined(["head", "stem"]) != cache
    keys = {p.stem.split("-")[1]: p.stem.rsplit("-", 1)[1] for p in tmp_path.glob("stress-*")}
    assert {keys["fp32"], keys["fp16"]} == {cache.key[:16]}
    refined = {keys[n] for n in ("fp8", "fakequant", "fakequant_weights", "fakequant_activations")}
    assert refined == {built.cache.key[:16]}


def test_a_recorded_choice_is_rebuilt_without_timing():
    """`replay` rebuilds a recorded choice: the same layers step aside and run scaled_mm, the
    same output, and the timer is never called."""
    model, x, plan = _setup()
    table = {
        b: {"stem": (10.0, None, 1.0), "k3": (10.0, None, SLOW), "k3b": (10.0, None, SLOW),
            "head": (10.0, 4.0, SLOW if b == 1 else 1.0)}
        for b in (1, 4)
    }  # fmt: skip
    first = _fastest(model, x, plan, table)
    choice = first.info().layout.kernel_choice
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.replayed(choice))
    again = build_fp8(model, CPU, x, plan, dtype=torch.float32, spec=spec, timer=lambda fn: 1 / 0)
    assert again.info().layout.kernel_choice == choice
    assert again.info().layout.stepped_aside == ["stem"]
    assert type(again.eager.head).__name__ == "Unfused"  # scaled_mm at both batches
    with torch.no_grad():
        assert torch.equal(again.eager(x), first.eager(x))


def test_the_record_holds_the_stepped_aside_layers_and_old_records_still_read():
    rows = [
        LayerKernel(name="a", kernel="fp16", fused_us=10.0, fp16_us=5.0, batch=1),
        LayerKernel(name="b", kernel="fused", fused_us=10.0, scaled_mm_us=11.0, batch=1),
    ]
    base = dict(
        name="fp8", compute_dtype="float16", device="cuda", compiled=True, fp8_real=["b"],
        fp8_emulated=[], fp8_kernel="fastest", fp16_layers=3, weight_bytes=1, numerics={},
    )  # fmt: skip
    info = EngineInfo(**base, fp8_kernel_choice=rows, fp8_stepped_aside=["a"])
    assert EngineInfo.model_validate_json(info.model_dump_json()) == info
    with pytest.raises(ValueError, match="kernel choice ran fp16"):
        EngineInfo(**base, fp8_kernel_choice=rows)
    with pytest.raises(ValueError, match="runs no real FP8"):
        EngineInfo(**{**base, "fp8_real": ["a", "b"]}, fp8_kernel_choice=rows,
                   fp8_stepped_aside=["a"])  # fmt: skip
    old = {
        **base,
        "fp8_kernel_choice": [
            {"name": "b", "kernel": "scaled_mm", "fused_us": 2.0, "scaled_mm_us": 1.0, "batch": 1}
        ],
    }
    assert EngineInfo.model_validate(old).layout.stepped_aside == []  # schema 16: no such field


def test_a_study_rebuilt_from_its_record_replays_the_choice():
    """`quantstudy extend` hands the recorded choice to the study's builders: the FP8 engine
    is rebuilt from it without timing, and the emulations leave the same layers float."""
    from quantstudy.study import engines as study_engines

    model, x, plan = _setup()
    table = {1: {"stem": (10.0, None, SLOW), "k3": (10.0, None, SLOW), "k3b": (10.0, None, 1.0),
                 "head": (10.0, 10.0, SLOW)}}  # fmt: skip
    choice = _fastest(model, x, plan, table).info().layout.replay()
    config = StudyConfig(model="m", data="d", fp8_kernel="fastest", batches=[1])
    spec = config.build_spec(choice)
    builders = study_engines.study_builders(config, model, x, plan, True, CPU, spec)
    layout = builders["fp8"](FP8Layout()).info().layout
    assert layout.stepped_aside == ["k3b"]
    assert type(builders["fakequant"](layout).eager.k3b) is nn.Conv2d
