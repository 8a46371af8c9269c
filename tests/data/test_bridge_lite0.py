"""EfficientNet-Lite0 (real weights, the committed H200 study): its exported Q/DQ ONNX computes
what the study's fake-quant engine computes, at the reassociation floor, on onnxruntime (CPU).

The check rebuilds the study from examples/tf_efficientnet_lite0-h200/study.json (weights from
the efficientnet-lite0 package, the record's 32 calibrated scales) and measures the floor on the
same images: the fake-quant engine against itself channels-last. By default the first
`IMAGES` of the 1300 held-out images (sorted ids), so the test takes minutes on two cores; all
1300 are `evidence` (`make test-evidence`; docs/tensorrt.md).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from quantstudy.bridge.export import check_export, export_study

# slow: the export and two onnxruntime passes over the images take about two minutes on 2 cores
pytestmark = [
    pytest.mark.data,
    pytest.mark.shared("val-1300"),
    pytest.mark.slow,
    pytest.mark.committed("examples/tf_efficientnet_lite0-h200/study.json"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

STUDY = Path(__file__).resolve().parents[2] / "examples" / "tf_efficientnet_lite0-h200"
IMAGES = 200
WRONG_IMAGES = 64  # a scale 16 times too small shows on far fewer images than agreement needs


@pytest.fixture(scope="module")
def exported(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lite0") / "model.onnx"
    return export_study(STUDY, out, precision="fp32", data=shared_data / "val-1300")


def _numerics(result):
    return next(f for f in result.findings if f.name == "ONNX vs fake-quant")


def test_lite0_onnx_agrees_with_fake_quant_at_the_floor(exported, shared_data):
    result, notes = check_export(exported, shared_data / "val-1300", images=IMAGES)
    print("\n".join(result.lines() + notes))
    assert result, result.lines()
    assert exported.graph.layers and len(exported.graph.layers) == 32


@pytest.mark.evidence  # all 1300 images; not in CI
def test_lite0_onnx_at_the_floor_on_all_heldout_images(exported, shared_data):
    result, notes = check_export(exported, shared_data / "val-1300")
    print("\n".join(result.lines() + notes))
    assert result, result.lines()


def test_lite0_wrong_scale_fails(exported, shared_data, tmp_path):
    model = onnx.load(exported.qdq_path)
    init = next(i for i in model.graph.initializer if i.name == "blocks.5.0.conv_pw.input_scale")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) / 16, init.name))
    wrong = tmp_path / "wrong.onnx"
    onnx.save(model, wrong)
    exported.qdq_path, right = wrong, exported.qdq_path
    try:
        result, _ = check_export(exported, shared_data / "val-1300", images=WRONG_IMAGES)
    finally:
        exported.qdq_path = right
    print("\n".join(result.lines()))
    assert not result
    assert not _numerics(result).passed
