"""Per-layer sensitivity: a layer made fragile on purpose ranks first (CPU, tiny model)."""

import math

import pytest
import torch
from _search_nets import FRAGILE, LAYERS, make_fragile, small_net

from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.errors import UserError
from quantstudy.search.sensitivity import measure_sensitivity

torch.set_num_threads(1)


def _inputs(seed: int, n: int) -> torch.Tensor:
    return torch.randn(n, 3, 12, 12, generator=torch.Generator().manual_seed(seed))


def _table(net, all_but=False):
    calib = calibrate(net, LAYERS, [_inputs(1, 32)])
    plan = QuantPlan(LAYERS, True, calib)
    return measure_sensitivity(
        net, _inputs(0, 1)[:1], plan, _inputs(2, 48), all_but=all_but, batch=16
    )


def test_fragile_layer_ranks_first_and_only_because_of_the_outliers():
    plain = _table(small_net())
    assert plain.layers[0].layer != FRAGILE  # without the edit it is not the worst layer

    net = small_net()
    x = _inputs(2, 48)
    before = net(x)
    make_fragile(net)
    assert torch.equal(net(x), before)  # same float function: only FP8 can see the edit
    table = _table(net, all_but=True)
    assert table.layers[0].layer == FRAGILE
    assert [row.rank for row in table.layers] == list(range(1, len(LAYERS) + 1))
    fragile = table.layers[0]
    assert fragile.kl_mean > 10 * table.layers[1].kl_mean
    assert fragile.agreement <= min(r.agreement for r in table.layers[1:])
    # with every other layer quantized, leaving the fragile one out recovers the most
    worst_rest = min(table.layers, key=lambda r: r.all_but_kl_mean)
    assert worst_rest.layer == FRAGILE
    assert table.all_kl_mean >= fragile.all_but_kl_mean
    assert table.modes == ["only", "all_but"]
    assert table.n_images == 48
    kinds = {row.layer: row.kind for row in table.layers}
    assert kinds == {
        "0": "conv2d.kxk",
        "2": "conv2d.1x1",
        "4": "conv2d.1x1",
        "6": "conv2d.1x1",
        "10": "linear",
    }


def test_sensitivity_leaves_the_model_untouched_and_scores_finitely():
    net = small_net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    table = _table(net)
    for k, v in net.state_dict().items():
        assert torch.equal(v, state[k])
    assert all(math.isfinite(r.kl_mean) and 0 <= r.agreement <= 1 for r in table.layers)
    assert all(r.all_but_kl_mean is None for r in table.layers)


def test_empty_plan_is_a_user_error():
    net = small_net()
    calib = calibrate(net, LAYERS, [_inputs(1, 8)])
    with pytest.raises(UserError, match="at least one candidate"):
        measure_sensitivity(net, _inputs(0, 1), QuantPlan([], True, calib), _inputs(2, 4))
