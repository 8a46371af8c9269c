"""Calibration statistics shared across studies (`study/calib_stats.py`): observed once, reused
by other recipes and calibrators with the numbers a fresh calibration gives, and a damaged entry
observed again."""

import pytest
import torch
from _option_nets import LAYERS, images, pointwise_net

from quantstudy.quant.calibration.calibrate import Calibration, calibrate, stats_source
from quantstudy.quant.plan.build import build_plan
from quantstudy.record import StudyConfig
from quantstudy.record.quant_options import QuantOptions
from quantstudy.study.calib_stats import STATS_ENV, SharedStats
from quantstudy.study.prepare import prepare_study
from quantstudy.sweep.caches import host_cache_env

torch.set_num_threads(1)

_net = pointwise_net
CALIBRATORS = {"max": {}, "percentile": {"percentile": 99.9}, "mse": {}, "entropy": {}}


def _batches() -> list[torch.Tensor]:
    x = images()
    return [x[:12], x[12:]]


def _same(a: Calibration, b: Calibration) -> None:
    assert a == b  # calibrator, params, image count, groups, amax, per-tensor calibrators
    for field in ("channel_mean", "channel_amax", "second_moment"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x), field


def _store(tmp_path) -> SharedStats:
    return SharedStats.keyed(tmp_path / "stats", ["net", "data"])


@pytest.mark.parametrize("calibrator", CALIBRATORS)
def test_every_calibrator_from_shared_statistics_equals_a_fresh_calibration(
    tmp_path, capsys, calibrator
):
    net, params = _net(), CALIBRATORS[calibrator]
    store = _store(tmp_path)
    with stats_source(store):  # the first study observes (with another calibrator) and stores
        calibrate(net, LAYERS, _batches(), "max", second_moments=["3"])
    assert "observed and stored" in capsys.readouterr().err
    with stats_source(store):
        shared = calibrate(net, LAYERS, _batches(), calibrator, params, second_moments=["3"])
    assert "calibration statistics reused from" in capsys.readouterr().err
    fresh = calibrate(net, LAYERS, _batches(), calibrator, params, second_moments=["3"])
    _same(shared, fresh)


def test_reused_statistics_run_no_forward_pass(tmp_path):
    net, store = _net(), _store(tmp_path)
    with stats_source(store):
        calibrate(net, LAYERS, _batches(), "max")
    calls = []
    net[0].register_forward_hook(lambda *_: calls.append(1))
    with stats_source(store):
        calibrate(net, LAYERS, _batches(), "mse")
    assert len(calls) == 1  # the first batch, which finds the tensors that share a scale


def test_a_plan_with_per_layer_calibrators_and_rounding_reuses_them(tmp_path, capsys):
    net, store, batches = _net(), _store(tmp_path), _batches()
    rounding = QuantOptions(rounding="compensating")
    options = QuantOptions(rounding="compensating", layer_calibrators={"6": "mse"})
    with stats_source(store):
        build_plan(net, LAYERS, lambda: batches, batches[0][:1], QuantOptions())
        capsys.readouterr()
        build_plan(net, LAYERS, lambda: batches, batches[0][:1], rounding)
        # stored without the second moments compensating rounding needs: observed again
        assert "of 3 layers observed and stored" in capsys.readouterr().err
        shared = build_plan(net, LAYERS, lambda: batches, batches[0][:1], options)
    assert "(3 of 3 layers)" in capsys.readouterr().err
    fresh = build_plan(net, LAYERS, lambda: batches, batches[0][:1], options)
    _same(shared.calibration, fresh.calibration)
    assert shared.calibration.second_moment  # the moments came from the store


def test_other_layers_are_observed_and_added(tmp_path, capsys):
    net, store = _net(), _store(tmp_path)
    with stats_source(store):
        calibrate(net, ["3"], _batches())
        capsys.readouterr()
        shared = calibrate(net, LAYERS, _batches(), "percentile")
    err = capsys.readouterr().err
    assert "(1 of 3 layers)" in err and "statistics of 2 layers observed" in err
    _same(shared, calibrate(net, LAYERS, _batches(), "percentile"))
    assert sorted(p.name.split("-")[0] for p in store.folder.iterdir()) == LAYERS


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[:100]),  # cut off
        lambda p: p.write_bytes(b"not a torch file"),
        lambda p: torch.save({"key": torch.zeros(3, dtype=torch.uint8)}, p),  # another key
        lambda p: torch.save(torch.zeros(3), p),  # not an entry
    ],
    ids=["truncated", "garbage", "other-key", "tensor"],
)
def test_a_damaged_entry_is_observed_again(tmp_path, capsys, damage):
    net, store = _net(), _store(tmp_path)
    with stats_source(store):
        calibrate(net, LAYERS, _batches(), "max")
    damage(store.path("6"))
    capsys.readouterr()
    with stats_source(store):
        shared = calibrate(net, LAYERS, _batches(), "entropy")
    err = capsys.readouterr().err
    assert "observing it again" in err and "(2 of 3 layers)" in err
    _same(shared, calibrate(net, LAYERS, _batches(), "entropy"))
    capsys.readouterr()
    with stats_source(store):  # rewritten whole
        calibrate(net, LAYERS, _batches(), "max")
    assert "(3 of 3 layers)" in capsys.readouterr().err


def test_sweeps_share_the_statistics_per_host(monkeypatch, tmp_path):
    monkeypatch.delenv(STATS_ENV, raising=False)
    monkeypatch.setenv("QUANTSTUDY_CACHE_DIR", str(tmp_path))
    assert host_cache_env()[STATS_ENV] == str(tmp_path / "calibration")


def _config(data, recipe) -> StudyConfig:
    return StudyConfig(
        model="mobilenetv4_conv_small",
        data=data,
        weights="random",
        recipe=str(recipe),
        calib=4,
        heldout=4,
        device="cpu",
        eval_batch=2,
    )


def _recipe(tmp_path, name: str, calibrator: str, exclude_linear: bool) -> str:
    rules = "rules:\n  - include: {op: conv2d, kernel: 1, groups: dense}\n    why: pointwise\n"
    if not exclude_linear:
        rules += "  - include: {op: linear}\n    why: classifier\n"
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndescription: test\nformat: fp8_e4m3\n"
        "weights: {granularity: per_channel, fold_bn: true}\n"
        f"activations: {{granularity: per_tensor, calibrator: {calibrator}, params: {{}}}}\n"
        + rules
    )
    return str(path)


def test_a_second_study_with_another_recipe_and_calibrator_reuses_them(
    tiny_imagenet, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(STATS_ENV, str(tmp_path / "shared"))
    first = _recipe(tmp_path, "pw_max", "max", exclude_linear=True)
    second = _recipe(tmp_path, "pw_linear_mse", "mse", exclude_linear=False)
    prepare_study(_config(tiny_imagenet, first))
    assert "observed and stored" in capsys.readouterr().err
    shared = prepare_study(_config(tiny_imagenet, second))
    err = capsys.readouterr().err
    n = len(shared.layers)
    assert f"calibration statistics reused from {tmp_path / 'shared'}" in err
    assert f"({n - 1} of {n} layers)" in err  # the classifier was not in the first recipe
    monkeypatch.delenv(STATS_ENV)
    fresh = prepare_study(_config(tiny_imagenet, second))
    assert "reused" not in capsys.readouterr().err
    # the record's calibration section and the plan's statistics are the fresh ones exactly
    assert shared.calibration == fresh.calibration
    _same(shared.plan.calibration, fresh.plan.calibration)
