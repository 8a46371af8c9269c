"""Per-layer speed on CPU: a clean refusal, gains files, and the real input shapes."""

import json

import pytest
import torch
from _search_nets import LAYERS, small_net

from quantstudy.record import LayerSpeed, LayerSpeedSection
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.search.layer_speed import (
    gains_for,
    layer_input_shapes,
    load_layer_gains,
    measure_layer_speed,
)

torch.set_num_threads(1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cpu_is_refused_cleanly():
    with pytest.raises(UserError, match="per-layer speed needs a CUDA GPU"):
        measure_layer_speed(small_net(), torch.zeros(1, 3, 12, 12), LAYERS, batch=4)


def test_cpu_device_is_refused_even_with_a_gpu():
    with pytest.raises(UserError, match="per-layer speed needs a CUDA GPU"):
        measure_layer_speed(small_net(), torch.zeros(1, 3, 12, 12), LAYERS, batch=4, device="cpu")


def test_input_shapes_are_the_real_ones():
    shapes = layer_input_shapes(small_net(), torch.zeros(1, 3, 12, 12), LAYERS)
    assert shapes == {
        "0": (1, 3, 12, 12),
        "2": (1, 16, 12, 12),
        "4": (1, 32, 12, 12),
        "6": (1, 32, 12, 12),
        "10": (1, 32),
    }


def test_plain_gains_file(tmp_path):
    path = tmp_path / "gains.json"
    path.write_text(json.dumps({"batch": 32, "saved_ms": {"2": 0.01, "4": 0.03, "0": -0.002}}))
    table = load_layer_gains(path)
    assert table.source == "file" and not table.meaningful and table.batch == 32
    assert [r.layer for r in table.layers] == ["4", "2", "0"]
    assert [r.rank for r in table.layers] == [1, 2, 3]
    assert gains_for(table, ["0", "4"]) == {"0": -0.002, "4": 0.03}
    with pytest.raises(UserError, match="lack 1 candidate"):
        gains_for(table, ["0", "6"])


def test_saved_table_round_trips(tmp_path):
    table = LayerSpeedSection(
        source="measured",
        source_detail="cuda:0 (some GPU)",
        meaningful=True,
        batch=8,
        layers=[LayerSpeed(layer="4", batch=8, rank=1, saved_ms=0.5)],
    )
    path = tmp_path / "t.json"
    write_json_atomic(path, table.model_dump(mode="json"))
    back = load_layer_gains(path)
    assert back.layers == table.layers and back.source == "measured"
    assert back.source_detail.endswith(f"read from {path}")


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json", "not valid JSON"),
        (json.dumps({"batch": 0, "saved_ms": {"a": 1}}), "expected"),
        (json.dumps({"batch": 4, "saved_ms": {}}), "expected"),
        (json.dumps({"layers": [{"layer": "a"}]}), "per-layer speed table"),
        # a saving that is no number, or no plausible one, would decide the search alone
        ('{"batch": 4, "saved_ms": {"a": NaN}}', "NaN is not a finite number"),
        ('{"batch": 4, "saved_ms": {"a": -Infinity}}', "-Infinity is not a finite number"),
        (json.dumps({"batch": 4, "saved_ms": {"a": 0.1, "b": -1e30}}), r"layer b saves -1e\+30 ms"),
        (
            json.dumps(
                {
                    "layers": [{"layer": "a", "batch": 4, "rank": 1, "saved_ms": 2e4}],
                    "source": "measured",
                    "source_detail": "d",
                    "meaningful": True,
                    "batch": 4,
                }
            ),
            "at most 10000 ms either way",
        ),
    ],
)
def test_bad_gains_files(tmp_path, content, match):
    path = tmp_path / "g.json"
    path.write_text(content)
    with pytest.raises(UserError, match=match):
        load_layer_gains(path)
    with pytest.raises(UserError, match="not found"):
        load_layer_gains(tmp_path / "missing.json")
