"""Per-layer timing (`engines/layer_timing.py`) on CPU: the search and the kernel choice both
time a layer through `time_layer`, each with its own input and quantize rule."""

import torch
from _search_nets import LAYERS, small_net
from test_kernel_choice import CPU, _setup

from quantstudy.engines import layer_timing
from quantstudy.engines.builders import build_fp8
from quantstudy.engines.kernel_choice import choose_kernels
from quantstudy.engines.layer_timing import LayerTimes, time_layer
from quantstudy.record.build_spec import BuildSpec
from quantstudy.search import layer_speed

torch.set_num_threads(1)
STAND_IN_US = {"fused": 10.0, "scaled_mm": 5.0, "fp8": 1.0, "fp16": 100.0}


def _recording(monkeypatch):
    """`layer_timing.time_layer` replaced by one that records each call and returns the
    stand-in times of the sides it was given."""
    calls = []

    def fake(fp16, fp8, args, **options):
        calls.append({"sides": sorted(fp8), "args": args, **options})
        return LayerTimes({k: [STAND_IN_US[k]] for k in [*fp8, "fp16"]})

    monkeypatch.setattr(layer_timing, "time_layer", fake)
    return calls


def test_the_search_and_the_kernel_choice_time_through_one_routine(monkeypatch, tmp_path):
    """The search: a random input of each layer's shape at its batch, quantize counted (no
    scale to subtract). The kernel choice: each layer's real input captured in place, its
    input scale given so the shared quantize is subtracted. Both read back what it returned."""
    calls = _recording(monkeypatch)
    monkeypatch.setattr(layer_speed, "need_cuda", lambda device: None)  # CPU stands in
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "stand-in")
    net = small_net()
    example = torch.randn(1, 3, 12, 12)
    table = layer_speed.measure_layer_speed(net, example, LAYERS, batch=4, device="cpu")
    assert len(calls) == len(LAYERS)
    first = calls[0]
    assert first["sides"] == ["fp8"] and first["quantize_scale"] is None
    (x,) = first["args"]
    assert x.shape == (4, 3, 12, 12) and x.dtype == torch.float16
    assert not torch.equal(x[:1].float(), example)  # random, not the example
    assert {r.layer: r.fp16_ms.median for r in table.layers} == dict.fromkeys(LAYERS, 0.1)

    calls.clear()
    model, ex, plan = _setup()
    m = build_fp8(model, CPU, ex, plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")).eager
    choice = choose_kernels(m, model, plan, torch.float32, ex, CPU, 4, tmp_path / "c.json",
                            lambda fn: 1 / 0)  # fmt: skip
    k3 = calls[0]  # the first layer reads the example itself, tiled to the batch
    assert k3["sides"] == ["fused"] and torch.equal(k3["args"][0], ex[:1].repeat(4, 1, 1, 1))
    assert torch.equal(torch.as_tensor(k3["quantize_scale"]), torch.as_tensor(m.k3.x_scale))
    # then pw and proj, the 1x1 layers, each on its own input (16 and 32 channels)
    assert [(c["sides"], c["args"][0].shape[1]) for c in calls[1:]] == [
        (["fused", "scaled_mm"], 16),
        (["fused", "scaled_mm"], 32),
    ]
    rows = {c.name: (c.kernel, c.fused_us, c.scaled_mm_us) for c in choice if c.batch}
    assert rows["pw"] == ("scaled_mm", 10.0, 5.0)


def test_the_quantize_is_subtracted_from_the_fp8_sides_only_when_given():
    """A stand-in clock, called once per side in the order quantize, FP8 sides, fp16."""
    x = torch.randn(2, 4)
    order = iter([1.0, 11.0, 7.0, 20.0, 11.0, 20.0])
    clock = lambda fn: next(order)  # noqa: E731
    sides = {"fused": torch.relu, "scaled_mm": torch.relu}
    options = {"rounds": 1, "iters": 1, "warmup": 0, "device": CPU, "timer": clock}
    got = time_layer(torch.relu, sides, (x,), quantize_scale=0.5, **options)
    assert got.us == {"fused": [10.0], "scaled_mm": [6.0], "fp16": [20.0]}
    counted = time_layer(torch.relu, {"fp8": torch.relu}, (x,), quantize_scale=None, **options)
    assert counted.us == {"fp8": [11.0], "fp16": [20.0]} and counted.median("other") is None


def test_interleaved_rounds_give_one_time_per_round_per_side():
    x = torch.randn(8, 8)
    got = time_layer(
        torch.relu, {"fp8": torch.tanh}, (x,), quantize_scale=1.0, rounds=3, iters=2, warmup=1,
        device=CPU,
    )  # fmt: skip
    assert sorted(got.us) == ["fp16", "fp8"]
    assert all(len(v) == 3 and min(v) >= 0 for v in got.us.values())
    assert got.stats("fp16").n == 3 and got.ms("fp8") == [t / 1000 for t in got.us["fp8"]]
