"""Which GELU each layer runs, on the CPU: the engine's record names it per layer
(`FP8Layout.gelu`), the emulation computes the form the record names on that layer and erf
elsewhere, and a recipe's `gelu: erf` keeps cuBLASLt's tanh GELU out."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import timm
import torch
from _records import FIXTURE
from torch import nn
from torch.nn import functional as F

from quantstudy.engines.builders import BuiltEngine, build_fakequant, build_fp8
from quantstudy.quant.backends.cublaslt import CublasLtBackend
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.cublaslt.problem import LtEpilogue
from quantstudy.quant.layers.gelu import gelu_form_of, gelu_forms, gelu_module
from quantstudy.quant.layers.lt_matmul import LtFP8Matmul
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import FP8Layout, KernelChoice, StudyRecord
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import GeluForm, GeluPolicy
from quantstudy.report.markdown import render_markdown
from quantstudy.report.selfcheck import check_markdown

CPU = torch.device("cpu")
FC1 = "blocks.0.mlp.fc1"


@pytest.fixture(scope="module")
def vit() -> tuple[nn.Module, torch.Tensor, QuantPlan]:
    """timm's test_vit (6 blocks of width 64), seeded, with every block's fc1 and fc2 in the
    plan."""
    torch.manual_seed(0)
    model = timm.create_model("test_vit").eval()
    x = torch.randn(2, 3, 160, 160)
    layers = [f"blocks.{i}.mlp.{fc}" for i in range(6) for fc in ("fc1", "fc2")]
    return model, x, QuantPlan(layers, True, calibrate(model, layers, [x]))


def _gelu_io(module: nn.Module, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What block `block`'s fc1 wrote and what its GELU module made of it, in one forward pass."""
    seen: dict[str, torch.Tensor] = {}
    mlp = module.get_submodule(f"blocks.{block}.mlp")
    hooks = [
        mlp.fc1.register_forward_hook(lambda _m, _i, out: seen.__setitem__("fc1", out)),
        mlp.act.register_forward_hook(lambda _m, _i, out: seen.__setitem__("act", out)),
    ]
    with torch.no_grad():
        module(x)
    for h in hooks:
        h.remove()
    return seen["fc1"], seen["act"]


def test_the_emulation_runs_tanh_gelu_on_the_layer_the_record_marks_and_erf_elsewhere(
    vit: tuple[nn.Module, torch.Tensor, QuantPlan],
) -> None:
    model, x, plan = vit
    like = FP8Layout(gelu={FC1: GeluForm.TANH, "blocks.1.mlp.fc1": GeluForm.ERF})
    tanh = build_fakequant(model, CPU, x[:1], plan, like=like).module
    y, act = _gelu_io(tanh, x, 0)
    assert torch.equal(act, F.gelu(y, approximate="tanh"))  # the hand-computed reference
    assert not torch.equal(act, F.gelu(y))
    for block in (1, 5):  # marked erf, and not marked at all
        y, act = _gelu_io(tanh, x, block)
        assert torch.equal(act, F.gelu(y))
    erf = build_fakequant(model, CPU, x[:1], plan, like=FP8Layout()).module
    y, act = _gelu_io(erf, x, 0)
    assert torch.equal(act, F.gelu(y))


def _distances(
    engine: BuiltEngine, emulation: nn.Module, erf: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's largest distance from `emulation` and from the erf-only `erf`, on inputs
    twice as wide as the calibration's (more outputs where the GELU forms differ)."""
    wide = torch.randn(8, 3, 160, 160, generator=torch.Generator().manual_seed(1)) * 2
    with torch.no_grad():
        y = engine.module(wide).float()
        return (y - emulation(wide)).abs().max(), (y - erf(wide)).abs().max()


def test_a_cublaslt_engine_records_tanh_on_each_fc1_and_its_emulation_follows(
    vit: tuple[nn.Module, torch.Tensor, QuantPlan],
) -> None:
    """Off CUDA the cuBLASLt layer computes its tanh GELU in torch, so the float32 engine sits
    on its tanh emulation (float32 sums in another order apart) and off the erf one."""
    model, x, plan = vit
    spec = BuildSpec(kernel="cublaslt")
    engine = build_fp8(model, CPU, x[:1], plan, spec=spec, dtype=torch.float32)
    layout = engine.layout
    fc1s = [f"blocks.{i}.mlp.fc1" for i in range(6)]
    assert layout.gelu == dict.fromkeys(fc1s, GeluForm.TANH)
    assert layout.tanh_gelu == fc1s
    emulation = build_fakequant(model, CPU, x[:1], plan, like=layout).module
    acts = [emulation.get_submodule(f"blocks.{i}.mlp.act") for i in range(6)]
    assert all(act.approximate == "tanh" for act in acts)
    erf = build_fakequant(model, CPU, x[:1], plan).module
    to_tanh, to_erf = _distances(engine, emulation, erf)
    assert to_tanh * 4 < to_erf
    fused = build_fp8(model, CPU, x[:1], plan, spec=BuildSpec()).layout
    assert fused.gelu == dict.fromkeys(fc1s, GeluForm.ERF)


def test_a_recipe_requiring_erf_keeps_every_gelu_erf_under_cublaslt(
    vit: tuple[nn.Module, torch.Tensor, QuantPlan],
) -> None:
    model, x, plan = vit
    erf_plan = QuantPlan(plan.layers, True, plan.calibration, gelu=GeluPolicy.ERF)
    layout = build_fp8(model, CPU, x[:1], erf_plan, spec=BuildSpec(kernel="cublaslt")).layout
    assert set(layout.gelu.values()) == {GeluForm.ERF} and len(layout.gelu) == 6
    assert layout.tanh_gelu == []


@pytest.fixture
def lt_usable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """cuBLASLt counted usable on this CPU, where its layer computes what it does on the GPU
    (its GELU epilogue included), and the kernel choice's timing cache in the test's folder."""
    monkeypatch.setattr(CublasLtBackend, "availability", lambda self: (True, ""))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _fastest(
    model: nn.Module, x: torch.Tensor, plan: QuantPlan, fc1_lt: bool
) -> tuple[BuiltEngine, Callable[[], float | None]]:
    """The fastest engine of test_vit timed at batch 2 by a stand-in clock, and the clock's
    next unused time (None: every one used). The clock times block 0's fc1 and fc2 (the other
    blocks' layers have their shapes and read the timing cache), each: the shared quantize 0,
    fused 10, cuBLASLt (where offered) 1 on fc1 and 20 on fc2, scaled_mm 30, fp16 100, so
    cuBLASLt wins fc1 where it is offered and fused keeps fc2."""
    fc1 = [0.0, 10.0, *([1.0] if fc1_lt else []), 30.0, 100.0]
    times = iter([*fc1, 0.0, 10.0, 20.0, 30.0, 100.0])
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.timed([2]))
    engine = build_fp8(
        model, CPU, x[:1], plan, spec=spec, dtype=torch.float32, timer=lambda fn: next(times)
    )
    return engine, lambda: next(times, None)


def test_fastest_installs_cuBLASLt_s_gelu_epilogue_and_records_tanh_where_it_wins(
    vit: tuple[nn.Module, torch.Tensor, QuantPlan], lt_usable: None
) -> None:
    """cuBLASLt's layer is timed and installed made from the fused fc1 itself: GELU, bias and
    the FP8 write for fc2 in its own epilogue (the hand-off kept), no GELU op after it. The
    record says tanh on each fc1, the emulation follows, and the replay builds the same."""
    model, x, plan = vit
    engine, unused = _fastest(model, x, plan, fc1_lt=True)
    assert unused() is None
    layout = engine.layout
    fc1s = [f"blocks.{i}.mlp.fc1" for i in range(6)]
    rows = {c.name: c for c in layout.kernel_choice or []}
    assert {n: str(rows[n].kernel) for n in fc1s} == dict.fromkeys(fc1s, "cublaslt")
    assert rows[FC1].us == {"fused": 10.0, "cublaslt": 1.0, "scaled_mm": 30.0, "fp16": 100.0}
    assert rows[FC1].why == "FP8 hand-off: runs cublaslt with it (timed alone, without it)"
    assert layout.handoff == {fc1: fc1.replace("fc1", "fc2") for fc1 in fc1s}
    for name in fc1s:
        layer = engine.eager.get_submodule(name)
        assert type(layer) is LtFP8Matmul and layer.act == "gelu" and layer.out_scale is not None
        assert layer.lt_plan()[0] == LtEpilogue.GELU_BIAS
        assert not any(isinstance(m, nn.GELU) for m in layer.modules())
    assert layout.gelu == dict.fromkeys(fc1s, GeluForm.TANH)
    emulation = build_fakequant(model, CPU, x[:1], plan, like=layout).module
    erf = build_fakequant(model, CPU, x[:1], plan).module
    to_tanh, to_erf = _distances(engine, emulation, erf)
    assert to_tanh * 4 < to_erf
    spec = BuildSpec(kernel="fastest", choice=KernelChoice.replayed(layout.kernel_choice or []))
    again = build_fp8(model, CPU, x[:1], plan, spec=spec, dtype=torch.float32)
    assert again.layout.kernel_choice == layout.kernel_choice and again.layout.gelu == layout.gelu
    assert type(again.eager.get_submodule(FC1)) is LtFP8Matmul
    with torch.no_grad():
        assert torch.equal(again.module(x), engine.module(x))


def test_under_gelu_erf_fastest_offers_cuBLASLt_no_gelu_layer(
    vit: tuple[nn.Module, torch.Tensor, QuantPlan], lt_usable: None
) -> None:
    """The recipe requires erf: cuBLASLt is not timed on any fc1 (the clock, which gives it no
    time there, is used up exactly), every fc1 stays fused with erf, and cuBLASLt is still
    timed on each fc2 (its bias and residual epilogue has no GELU). The layers are timed
    again, not read from the timings cached under `gelu: any` just before."""
    model, x, plan = vit
    _fastest(model, x, plan, fc1_lt=True)
    erf_plan = QuantPlan(plan.layers, True, plan.calibration, gelu=GeluPolicy.ERF)
    engine, unused = _fastest(model, x, erf_plan, fc1_lt=False)
    assert unused() is None
    rows = {c.name: c for c in engine.layout.kernel_choice or []}
    for i in range(6):
        fc1, fc2 = rows[f"blocks.{i}.mlp.fc1"], rows[f"blocks.{i}.mlp.fc2"]
        assert fc1.kernel == "fused" and "cublaslt" not in fc1.us and "cublaslt" in fc2.us
    assert set(engine.layout.gelu.values()) == {GeluForm.ERF}


def test_a_module_s_form_is_found_inside_it() -> None:
    assert gelu_form_of(nn.Sequential(nn.Linear(2, 2), nn.GELU())) == GeluForm.ERF
    assert gelu_form_of(nn.Sequential(nn.Linear(2, 2), gelu_module(GeluForm.TANH))) == "tanh"
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.GELU("tanh")))
    assert gelu_forms(model, {"0": "gelu", "1": "gelu", "2": "relu"}) == {
        "0": GeluForm.ERF,
        "1": GeluForm.TANH,
    }


def _with_gelu(gelu: dict[str, str], recipe_gelu: str = "any") -> tuple[StudyRecord, list[str]]:
    """The report fixture's record with its FP8 engine's first two real layers computing GELU
    in their epilogue, of the forms `gelu` gives them, and the recipe's `gelu:`."""
    data = json.loads(FIXTURE.read_text())
    data["recipe"]["gelu"] = recipe_gelu
    for engine in data["engines"]:
        if engine["name"] == "fp8":
            real = engine["fp8_real"][:2]
            engine["fp8_kernel"] = "cublaslt"
            engine["fp8_epilogue"] = dict.fromkeys(real, "gelu")
            engine["fp8_gelu"] = dict(zip(real, gelu.values(), strict=False))
    return StudyRecord.model_validate(data), real


def test_the_method_section_states_the_tanh_layers_only_where_any_ran_tanh() -> None:
    record, real = _with_gelu({"a": "tanh", "b": "erf"})
    assert record.engine("fp8").layout.tanh_gelu == [real[0]]
    md = render_markdown(record)
    assert (
        f"GELU ran in the tanh form (cuBLASLt's epilogue; timm's is erf) on 1 of the 2 layers "
        f"whose epilogue computes it (`{real[0]}`)" in md
    )
    assert check_markdown(md, record) == []
    erf, _ = _with_gelu({"a": "erf", "b": "erf"}, recipe_gelu="erf")
    md = render_markdown(erf)
    assert "GELU ran in the tanh form" not in md
    assert "GELU: erf only (no backend runs its tanh form)" in md
    assert check_markdown(md, erf) == []
