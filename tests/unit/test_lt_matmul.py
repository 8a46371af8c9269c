"""The cuBLASLt layer on the CPU: which epilogue each fused layer state asks of cuBLASLt (or
why it falls back to the fused kernel), which GELU it states, and that off CUDA it computes the
fused layer's bits (its fallback is the fused layer's own code), with GELU in the form it
states."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantstudy.engines.unfused import Unfused
from quantstudy.quant.backends.cublaslt import CublasLtBackend
from quantstudy.quant.cublaslt.problem import LtEpilogue
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.lt_matmul import LtFP8Matmul
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.record.vocab import Activation, GeluPolicy


def _layers(act: Activation = Activation.NONE, **kw: object) -> tuple[LtFP8Matmul, FusedFP8Matmul]:
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    spec = FP8LayerSpec(x_scale=0.02, per_channel=True, dtype=torch.float32, act=act, **kw)  # type: ignore[arg-type]
    return LtFP8Matmul(linear, spec), FusedFP8Matmul(linear, spec)


@pytest.mark.parametrize(
    ("act", "out_scale", "res_act", "want"),
    [
        (Activation.NONE, None, None, LtEpilogue.BIAS),
        (Activation.GELU, 0.1, None, LtEpilogue.GELU_BIAS),
        (Activation.RELU, None, None, LtEpilogue.RELU_BIAS),
        (Activation.NONE, None, Activation.NONE, LtEpilogue.BIAS_RESIDUAL),
        (Activation.SILU, None, None, None),
        (Activation.NONE, None, Activation.RELU, None),  # ResNet's add then ReLU
    ],
)
def test_each_state_gets_cuBLASLt_s_epilogue_or_the_fused_kernel(
    act: Activation, out_scale: float | None, res_act: Activation | None, want: LtEpilogue | None
) -> None:
    lt, _ = _layers(act, out_scale=out_scale)
    lt.res_act = res_act
    epilogue, why = lt.lt_plan()
    assert epilogue == want
    assert lt.lt_answer.startswith("cuBLASLt" if want else "fused kernel: ")
    assert why


def test_the_gelu_it_runs_is_stated() -> None:
    lt, _ = _layers(Activation.GELU)
    assert lt.gelu_form == "tanh"
    lt.res_act = Activation.RELU  # now the fused kernel runs the layer, with erf
    assert lt.gelu_form == "erf"
    assert _layers()[0].gelu_form is None
    erf_only, _ = _layers(Activation.GELU, out_scale=0.1, gelu=GeluPolicy.ERF)
    assert erf_only.gelu_form == "erf"


def test_a_recipe_requiring_erf_leaves_gelu_to_the_fused_kernel_with_why() -> None:
    lt, _ = _layers(Activation.GELU, out_scale=0.1, gelu=GeluPolicy.ERF)
    assert lt.lt_plan() == (None, "the recipe requires erf GELU; cuBLASLt's is the tanh form")
    assert lt.lt_answer.startswith("fused kernel: the recipe requires erf GELU")
    plain, _ = _layers(gelu=GeluPolicy.ERF)  # a layer without GELU keeps cuBLASLt's bias
    assert plain.lt_plan()[0] == LtEpilogue.BIAS


def test_off_cuda_it_computes_the_fused_layer_s_bits_with_its_gelu_form() -> None:
    x = torch.randn(5, 64)
    lt, fused = _layers()
    assert torch.equal(lt(x), fused(x))
    lt, fused = _layers(Activation.GELU, gelu=GeluPolicy.ERF)
    assert torch.equal(lt(x), fused(x))  # erf required: the fused layer's own GELU
    lt, _ = _layers(Activation.GELU)
    _, product = _layers()  # the same product and bias, no activation
    want = nn.functional.gelu(product(x), approximate="tanh")
    assert torch.equal(lt(x), want)
    assert not torch.equal(want, nn.functional.gelu(product(x)))  # the forms differ here


def test_unfused_adds_only_what_the_candidate_layer_does_not_compute() -> None:
    lt, fused = _layers(Activation.GELU)
    assert isinstance(Unfused.like(lt, fused).act, nn.Identity)  # the layer took the GELU
    plain = nn.Linear(64, 32)
    assert isinstance(Unfused.like(plain, fused).act, nn.GELU)
    lt_res, fused_res = _layers()
    lt_res.res_act = fused_res.res_act = Activation.NONE
    wrapped = Unfused.like(lt_res, fused_res)
    x, r = torch.randn(5, 64), torch.randn(5, 32)
    assert wrapped.layer_sums and torch.equal(wrapped(x, r), fused_res(x, r))


def test_the_record_s_note_names_the_layers_that_fell_back() -> None:
    from quantstudy.quant.layers.lt_matmul import lt_note

    fc1, _ = _layers(Activation.GELU, out_scale=0.1)
    fc2, _ = _layers()
    fc2.res_act = Activation.RELU
    model = nn.Sequential(fc1, fc2)
    assert lt_note(model) == (
        "cuBLASLt ran 1 layers' epilogues, the fused kernel 1: "
        "1 (an activation (relu) after the residual sum)"
    )
    assert lt_note(nn.Sequential(nn.Linear(2, 2))) is None


def test_made_from_a_fused_layer_it_keeps_its_state_and_is_refused_where_it_falls_back() -> None:
    """What the kernel choice times and installs (`CublasLtBackend.from_fused`): the fused
    layer's whole state, so it computes what the layer built for cuBLASLt computes, without the
    hooks on the fused layer (here one that would raise); None where cuBLASLt has no epilogue
    for that state, so the choice does not time a fused layer under cuBLASLt's name."""
    backend = CublasLtBackend()
    x, r = torch.randn(5, 64), torch.randn(5, 32)
    built, fused = _layers(Activation.GELU, out_scale=0.1)
    fused.register_forward_pre_hook(lambda _m, _a: 1 / 0)
    made = backend.from_fused(fused, GeluPolicy.ANY)
    assert type(made) is LtFP8Matmul and made.lt_plan()[0] == LtEpilogue.GELU_BIAS
    assert torch.equal(made(x).float(), built(x).float())  # tanh GELU, the FP8 write
    assert backend.from_fused(fused, GeluPolicy.ERF) is None  # the recipe requires erf
    # asked without a copy, as the engine asks for every row of a choice
    assert backend.runs_own_kernel(fused, GeluPolicy.ANY)
    assert not backend.runs_own_kernel(fused, GeluPolicy.ERF)
    _, fused_res = _layers()
    fused_res.res_act = Activation.NONE
    made = backend.from_fused(fused_res, GeluPolicy.ANY)
    assert made.lt_plan()[0] == LtEpilogue.BIAS_RESIDUAL
    assert torch.equal(made(x, r), fused_res(x, r))
    fused_res.res_act = Activation.RELU  # ResNet's add then ReLU
    assert backend.from_fused(fused_res, GeluPolicy.ANY) is None
    assert not backend.runs_own_kernel(fused_res, GeluPolicy.ANY)
    promoted, _ = _layers(promote=64)
    assert promoted.lt_plan() == (
        None, "products promoted every 64: cuBLASLt sums fast or per K tile"
    )  # fmt: skip
    assert backend.from_fused(nn.Linear(64, 32), GeluPolicy.ANY) is None
