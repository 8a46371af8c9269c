"""Which GELU each layer runs, on the CPU: the engine's record names it per layer
(`FP8Layout.gelu`), the emulation computes the form the record names on that layer and erf
elsewhere, and a recipe's `gelu: erf` keeps cuBLASLt's tanh GELU out."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from _records import FIXTURE
from torch import nn
from torch.nn import functional as F

from quantstudy.engines.builders import build_fakequant, build_fp8
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.gelu import gelu_form_of, gelu_forms, gelu_module
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import FP8Layout, StudyRecord
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
    wide = torch.randn(8, 3, 160, 160, generator=torch.Generator().manual_seed(1)) * 2
    with torch.no_grad():
        y = engine.module(wide).float()
        to_tanh, to_erf = (y - emulation(wide)).abs().max(), (y - erf(wide)).abs().max()
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
