"""The search's FP8 quality option step on a tiny net: tried in order, kept when the paired KL
change's interval lies below zero, shares of the total decrease, and the kept options written
into the recipe."""

import pytest
import yaml
from _option_nets import LAYERS
from _option_nets import images as _data
from _option_nets import pointwise_net as _net

from quantstudy.recipe.options import with_quant_options
from quantstudy.recipe.schema import parse_recipe
from quantstudy.record.quant_options import QuantOptions
from quantstudy.search.options import TRIED, explore_options, for_layers, option_lines


def test_option_step_keeps_what_lowers_kl_and_shares_the_decrease():
    net, x = _net(), _data()
    options, plan, steps = explore_options(
        net, x[:1], LAYERS, lambda: [x[:12], x[12:]], x, QuantOptions(), batch=8, device="cpu"
    )
    assert steps[0].option == "recipe's own options" and steps[0].kept
    tried = list(TRIED)
    if not steps[1].kept:  # the rounding searches refine compensating rounding only
        tried.remove("scale candidates and refinement")
    assert [s.option for s in steps[1:]] == tried
    kl = steps[0].kl_mean
    assert steps[0].kl_change is None
    for step in steps[1:]:
        assert step.kl_change_low <= step.kl_change <= step.kl_change_high
        assert step.kl_change == pytest.approx(step.kl_mean - kl)
        assert step.kept == (step.kl_change_high < 0)
        if step.kept:
            kl = step.kl_mean
            assert step.share is not None and step.share > 0
        else:
            assert step.share is None
    shares = [s.share for s in steps if s.share is not None]
    if shares:
        assert sum(shares) == pytest.approx(1.0)
    assert plan.rounding == options.rounding
    assert len(option_lines(steps)) == len(steps) + 1


def test_kept_options_reach_the_recipe_and_stay_valid():
    base = parse_recipe(b"name: r\nrules:\n  - include: {op: conv2d}\n", "r")
    options = QuantOptions(
        rounding="compensating",
        scale_candidates=16,
        refine_sweeps=4,
        bias_correction=True,
        layer_calibrators={"3": "mse", "6": "percentile"},
        migration="smooth",
        headroom=4.0,
        propagated=True,
    )
    recipe = for_layers(with_quant_options(base, options), ["3"])
    again = parse_recipe(yaml.safe_dump(recipe.model_dump(mode="json")).encode(), "again")
    assert again.weights.rounding == "compensating" and again.weights.bias_correction
    assert (again.weights.scale_candidates, again.weights.refine_sweeps) == (16, 4)
    assert again.activations.layer_calibrators == {"3": "mse"}
    assert again.activations.migration == "smooth" and again.activations.headroom == 4.0
    assert again.weights.propagated


def test_options_the_recipe_has_are_not_tried_again():
    net, x = _net(), _data()
    _, _, steps = explore_options(
        net,
        x[:1],
        LAYERS,
        lambda: [x[:12], x[12:]],
        x,
        QuantOptions(rounding="compensating", migration="smooth"),
        batch=8,
        device="cpu",
    )
    assert [s.option for s in steps[1:]] == [
        "scale candidates and refinement",
        "layer_calibrators: chosen",
        "headroom: 4",
        "propagated fit",
    ]
    assert steps[0].kl_mean >= 0


def test_a_kept_propagated_fit_is_the_plan_returned():
    """The propagated fit is tried last, with bias correction, and when kept the returned plan
    carries the fitted weights (so the searched recipe's engines deploy what was scored)."""
    net, x = _net(), _data()
    options, plan, steps = explore_options(
        net,
        x[:1],
        LAYERS,
        lambda: [x[:12], x[12:]],
        x,
        QuantOptions(rounding="compensating", migration="smooth", layer_calibrators={"3": "mse"}),
        batch=8,
        device="cpu",
    )
    (step,) = [s for s in steps if s.option == "propagated fit"]
    assert steps[-1] is step or steps[-1].option == "propagated fit"
    assert options.propagated == step.kept
    assert (plan.fitted is not None) == step.kept
    if step.kept:
        assert options.bias_correction


def test_an_option_that_changes_nothing_is_not_kept(monkeypatch):
    """A trial with the very same per-image KL: change 0 [0, 0], not below zero, not kept."""
    import quantstudy.search.options as opts

    monkeypatch.setattr(opts, "TRIED", {"headroom: 1": {"headroom": 1.0, "migration": "none"},
                                        "nothing new": {"refine_sweeps": 0}})  # fmt: skip
    monkeypatch.setattr(opts, "_already", lambda options, change: False)
    net, x = _net(), _data()
    _, _, steps = opts.explore_options(
        net, x[:1], LAYERS, lambda: [x[:12], x[12:]], x, QuantOptions(), batch=8, device="cpu"
    )
    for step in steps[1:]:
        assert step.kl_change == 0.0 and step.kl_change_high == 0.0 and not step.kept
        assert step.share is None
