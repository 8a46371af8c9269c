"""Propagated FP8 weight fitting (`quant/fitting/propagated.py`, a recipe's `propagated`) on CPU:
the bias fit through an activation, what stays unchanged without bias correction, the in-sample
mean match it promises, the engines storing the fitted values alike, and a bad option value."""

import warnings

import pytest
import torch
from _option_nets import LAYERS, deep_net, images
from torch import nn

from quantstudy.engines.builders import build_fakequant, build_fp8, build_fp32, deployed_copy
from quantstudy.engines.run import run_engine
from quantstudy.quant.fitting.propagated import bias_shift, execution_order
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.builtin import RENAMED, builtin_names, load_recipe
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.schema import parse_recipe
from quantstudy.record import RecipeInfo
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.quant_options import QuantOptions

CPU = torch.device("cpu")
_net, _data = deep_net, images


def _plan(**options):
    x = _data()
    return build_plan(_net(), LAYERS, lambda: [x[:12], x[12:]], x[:1], QuantOptions(**options))


def test_bias_shift_without_activation_is_the_mean_difference():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    rounded = exact * 0.9 + 0.25
    assert torch.allclose(bias_shift(exact, rounded, None), rounded.mean(0) - exact.mean(0))


def test_bias_shift_through_relu6_matches_the_mean_after_it():
    g = torch.Generator().manual_seed(0)
    exact = 2 * torch.randn(20000, 4, generator=g, dtype=torch.float64)
    rounded = 0.9 * exact + 0.3 + 0.1 * torch.randn(20000, 4, generator=g, dtype=torch.float64)
    act = nn.ReLU6(inplace=True)
    before = exact.clone()
    shift = bias_shift(exact, rounded, act)
    assert torch.equal(exact, before)  # the in-place activation ran on copies
    after = nn.functional.relu6(rounded - shift).mean(0) - nn.functional.relu6(exact).mean(0)
    assert after.abs().max() < 1e-9
    pre = rounded.mean(0) - exact.mean(0)  # matching before the activation would move more
    assert (shift - pre).abs().min() > 0.05


def test_bias_shift_leaves_a_channel_that_never_fires():
    exact = -torch.rand(500, 2, dtype=torch.float64) - 1.0  # always below 0: ReLU6 gives 0
    rounded = exact + 0.2
    assert torch.equal(bias_shift(exact, rounded, nn.ReLU6()), torch.zeros(2, dtype=torch.float64))


def test_execution_order_follows_the_forward_pass():
    net = _net()
    assert execution_order(net, ["9", "3", "6"], _data()[:1]) == ["3", "6", "9"]


def test_without_bias_correction_nearest_weights_and_biases_are_unchanged():
    net, x = _net(), _data()
    plain, fitted = _plan(), _plan(propagated=True)
    folded = deployed_copy(net, x[:1], True)
    ref, got = plain.stored_weights(folded), fitted.stored_weights(folded)
    for name in LAYERS:
        assert torch.equal(ref[name][0].float(), got[name][0].float())
        assert torch.equal(ref[name][1], got[name][1])
        assert torch.allclose(fitted.fitted.biases[name], folded.get_submodule(name).bias)


@pytest.mark.parametrize("rounding", ["nearest", "compensating"])
def test_fitted_biases_match_the_reference_means_on_the_calibration_images(rounding):
    """In sample, each layer's mean output where the next layer reads it (after its activation,
    or the output itself) equals the fp32 network's: what the bias fit promises."""
    net, x = _net(), _data()
    plan = _plan(propagated=True, bias_correction=True, rounding=rounding)
    ref = deployed_copy(net, x[:1], True)
    emulation = build_fakequant(net, CPU, x[:1], plan).module
    # where the next layer reads each fitted layer's output
    read_at = {"3": "5", "6": "8", "9": "9"}

    def means(model):
        seen = {}
        hooks = [
            model.get_submodule(at).register_forward_hook(
                lambda _m, _i, out, n=n: seen.__setitem__(n, out.mean(dim=(0, 2, 3)).clone())
            )
            for n, at in read_at.items()
        ]
        with torch.no_grad():
            model(x)
        for h in hooks:
            h.remove()
        return seen

    want, got = means(ref), means(emulation)
    for name in LAYERS:
        scale = want[name].abs().max()
        # the sample of positions makes the match through an activation approximate
        tol = 1e-5 if name == "9" else 0.02
        assert (got[name] - want[name]).abs().max() <= tol * scale, name
    plain = means(
        build_fakequant(net, CPU, x[:1], _plan(bias_correction=True, rounding=rounding)).module
    )
    assert (got["9"] - want["9"]).abs().max() < (plain["9"] - want["9"]).abs().max()


def test_every_engine_stores_the_fitted_weights_and_biases():
    net, x = _net(), _data()
    plan = _plan(propagated=True, bias_correction=True, rounding="compensating")
    fq = run_engine(build_fakequant(net, CPU, x[:1], plan), x)
    for kernel in ("fused", "scaled_mm"):
        out = run_engine(
            build_fp8(net, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel=kernel)), x
        )
        assert torch.allclose(out, fq, rtol=1e-4, atol=1e-4), kernel


def test_a_fit_of_another_model_is_refused():
    plan = _plan(propagated=True, bias_correction=True)
    other = _net()
    with torch.no_grad():
        other[3].weight.mul_(2)
    with pytest.raises(ValueError, match="fitted for another model"):
        plan.stored_weights(deployed_copy(other, _data()[:1], True))


def test_a_bad_sequential_value_is_one_clear_line():
    text = "name: t\nweights: {sequential: sometimes}\nrules:\n  - include: {op: conv2d}\n"
    with pytest.raises(UserError) as err:
        parse_recipe(text.encode(), "r.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("r.yaml line") and "sequential" in message


def test_an_old_recipe_with_sequential_still_loads():
    """Recipes written before the fit was named `propagated` say `sequential`: the same fit,
    the same plan options, and one FutureWarning naming the file, the line and the new key (the
    new key warns of nothing); a recipe giving both names is refused (one key, two spellings)."""
    rules = "rules:\n  - include: {op: conv2d}\n"
    with pytest.warns(FutureWarning) as caught:
        old = parse_recipe(f"name: t\nweights:\n  sequential: true\n{rules}".encode(), "old.yaml")
    assert [str(w.message) for w in caught] == [
        "old.yaml line 3: weights.sequential is now named weights.propagated (the same option); "
        "rename the key"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = parse_recipe(f"name: t\nweights: {{propagated: true}}\n{rules}".encode(), "new.yaml")
    assert old.weights.propagated and old.weights == new.weights
    assert quant_options(old).propagated and quant_options(old) == quant_options(new)
    assert not parse_recipe(f"name: t\n{rules}".encode(), "r.yaml").weights.propagated
    both = f"name: t\nweights: {{propagated: true, sequential: true}}\n{rules}"
    with pytest.raises(UserError, match="unknown key 'sequential'"):
        parse_recipe(both.encode(), "both.yaml")


def test_the_renamed_builtin_still_resolves_with_one_warning():
    """`generic_pointwise_sequential` is `generic_pointwise_propagated` now: the old name, bare
    or as a record's source, loads the new recipe with a one-line FutureWarning naming both."""
    assert RENAMED == {"generic_pointwise_sequential": "generic_pointwise_propagated"}
    assert "generic_pointwise_sequential" not in builtin_names()
    new, source = load_recipe("generic_pointwise_propagated")
    assert new.name == "generic_pointwise_propagated" and new.weights.propagated
    for old in ("generic_pointwise_sequential", "builtin:generic_pointwise_sequential"):
        with pytest.warns(FutureWarning) as caught:
            assert load_recipe(old) == (new, source)
        (warning,) = caught
        message = str(warning.message)
        assert "\n" not in message and "generic_pointwise_propagated" in message
        assert warning.filename == __file__  # it points at the caller, not at the recipe code


def test_an_old_record_with_sequential_loads_as_propagated():
    """Records before schema 26 name the fit `sequential`: it reads into `propagated`, which a
    record writes from then on."""
    fields = {
        "name": "t",
        "source": "builtin:t",
        "sha256": "0" * 64,
        "description": "",
        "format": "fp8_e4m3",
        "weight_granularity": "per_channel",
        "fold_bn": True,
        "calibrator": "max",
        "calibrator_params": {},
        "selected": [],
        "excluded": [],
        "counts": {},
    }
    info = RecipeInfo.model_validate(fields | {"sequential": True})
    assert info.propagated and info == RecipeInfo.model_validate(fields | {"propagated": True})
    dumped = info.model_dump(mode="json")
    assert dumped["propagated"] is True and "sequential" not in dumped
    assert not RecipeInfo.model_validate(fields).propagated


def test_sensitivity_scores_the_fitted_weights_and_biases():
    """The search's sensitivity table quantizes with what engines deploy: with a propagated plan
    its all-layers score is the fp32 emulation's (fitted biases, not re-corrected ones)."""
    from quantstudy.engines.run import run_engine
    from quantstudy.quality.image_scores import kl_per_image
    from quantstudy.search.sensitivity import measure_sensitivity

    net, x = _net(), _data()
    plan = _plan(rounding="compensating", bias_correction=True, propagated=True)
    table = measure_sensitivity(net, x[:1], plan, x, fold=True, batch=8, device="cpu")
    ref = run_engine(build_fp32(net, CPU), x, 8)
    emu = run_engine(build_fakequant(net, CPU, x[:1], plan), x, 8)
    assert table.all_kl_mean == pytest.approx(float(kl_per_image(ref, emu).mean()), rel=1e-5)
