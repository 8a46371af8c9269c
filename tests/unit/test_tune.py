"""End-to-end output tuning (`quant/fitting/tune.py`) on CPU: it lowers the held-out KL it reports,
the engines compute exactly what it measured, bias-only tuning leaves the weight scales alone, a
tuning that does not help returns the start, the straight-through gradient, and bad input."""

import pytest
import torch
from _option_nets import LAYERS, deep_net
from torch import nn

import quantstudy.quant.fitting.tune as tune
from quantstudy.engines.builders import build_fakequant, build_fp8, build_fp32, deployed_copy
from quantstudy.engines.run import run_engine
from quantstudy.quality.image_scores import kl_per_image
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.schema import parse_recipe
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.quant_options import QuantOptions

CPU = torch.device("cpu")


def _images(n: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 12, 12, generator=g) + torch.randn(n, 3, 1, 1, generator=g) + 1


def _net() -> nn.Module:
    """`deep_net` with its logits scaled up, so FP8 rounding moves the softmax measurably."""
    net = deep_net()
    with torch.no_grad():
        net[-1].weight.mul_(20)
    return net


def _plan(x: torch.Tensor, **options):
    """Without bias correction, so the start has a mean shift for tuning to remove."""
    opts = QuantOptions(**options)
    return build_plan(_net(), LAYERS, lambda: list(x.split(16)), x[:1], opts)


def _heldout(x: torch.Tensor) -> torch.Tensor:
    return x[torch.arange(len(x)) % tune.HOLDOUT == tune.HOLDOUT - 1]


def test_tuning_lowers_the_heldout_kl_and_engines_compute_what_it_measured():
    x = _images()
    plan = _plan(x, tune="scale_bias", tune_epochs=4)
    before, after = plan.tuned.heldout_kl
    assert plan.tuned.epoch >= 1 and after < 0.5 * before
    held = _heldout(x)
    ref = run_engine(build_fp32(_net(), CPU), held)
    emulated = run_engine(build_fakequant(_net(), CPU, x[:1], plan), held)
    # the stored scales (times the gains) and biases give what tuning scored
    assert float(kl_per_image(ref, emulated).mean()) == pytest.approx(after, rel=2e-3)
    fp8 = build_fp8(_net(), CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel="fused"))
    assert torch.allclose(run_engine(fp8, held), emulated, rtol=1e-4, atol=1e-4)


def test_bias_tuning_keeps_the_stored_weights():
    x = _images()
    plain, tuned = _plan(x), _plan(x, tune="bias", tune_epochs=1)
    folded = deployed_copy(_net(), x[:1], True)
    want, got = plain.stored_weights(folded), tuned.stored_weights(folded)
    for name in LAYERS:
        assert torch.equal(want[name][0].float(), got[name][0].float())
        assert torch.equal(want[name][1], got[name][1])
    biases = tuned.fitted.biases
    assert any(not torch.equal(biases[n], folded.get_submodule(n).bias) for n in LAYERS)


def test_a_tuning_that_does_not_help_returns_the_start(monkeypatch):
    monkeypatch.setattr(tune, "LR", 0.0)  # Adam with no step: every epoch scores the start
    x = _images()
    plain, tuned = _plan(x), _plan(x, tune="scale_bias", tune_epochs=2)
    assert tuned.tuned.epoch == 0 and tuned.tuned.heldout_kl[0] == tuned.tuned.heldout_kl[1]
    folded = deployed_copy(_net(), x[:1], True)
    start = deployed_copy(_net(), x[:1], True, plain)
    want, got = plain.stored_weights(folded), tuned.stored_weights(folded)
    for name in LAYERS:
        assert torch.equal(got[name][1], want[name][1])
        assert torch.equal(tuned.fitted.biases[name], start.get_submodule(name).bias.detach())


def test_the_straight_through_gradient_stops_where_the_input_saturates():
    qdq = QDQ(nn.Conv2d(2, 2, 1), FP8LayerSpec(0.01, True, torch.float32))  # range +-4.48
    x = torch.tensor([0.5, -3.0, 5.0, -9.0]).reshape(1, 2, 2, 1).requires_grad_(True)
    y = tune._straight_through(qdq, x)
    assert torch.equal(y.detach(), qdq.quantize_input(x.detach()))
    y.sum().backward()
    assert x.grad.flatten().tolist() == [1.0, 1.0, 0.0, 0.0]


def test_tuning_needs_images_to_hold_out():
    x = _images(4)
    with pytest.raises(ValueError, match="at least 5 calibration images"):
        _plan(x, tune="bias")


@pytest.mark.parametrize(
    "weights, words",
    [
        ("{tune: always}", "tune"),
        ("{tune: bias, tune_epochs: 0}", "tune_epochs"),
        ("{tune: scale_bias, granularity: per_tensor}", "per_channel"),
    ],
)
def test_a_bad_tune_option_is_one_clear_line(weights, words):
    text = f"name: t\nweights: {weights}\nrules:\n  - include: {{op: conv2d}}\n"
    with pytest.raises(UserError) as err:
        parse_recipe(text.encode(), "r.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("r.yaml") and words in message
