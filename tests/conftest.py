"""Shared test set-up: few threads (2-core CI machine), and the skips for data and GPU tests."""

from pathlib import Path

import pytest
import torch
from PIL import Image

torch.set_num_threads(2)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "imagenet"


def pytest_collection_modifyitems(config, items):
    has_data = SHARED_DATA.is_dir()
    has_gpu = torch.cuda.is_available()
    for item in items:
        if "tests/data/" in str(item.fspath).replace("\\", "/") or item.get_closest_marker("data"):
            if not has_data:
                item.add_marker(pytest.mark.skip(reason=f"real data absent: {SHARED_DATA}"))
        if "tests/gpu/" in str(item.fspath).replace("\\", "/") or item.get_closest_marker("gpu"):
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="no CUDA GPU on this machine"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return SHARED_DATA


@pytest.fixture
def tiny_imagenet(tmp_path) -> Path:
    """An ImageNet-style folder of 2 classes (labels 0 and 1) with 6 random 48x48 JPEGs each."""
    g = torch.Generator().manual_seed(0)
    for wnid in ("n01440764", "n01443537"):
        (tmp_path / "data" / wnid).mkdir(parents=True)
        for i in range(6):
            pixels = (torch.rand(48, 48, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(tmp_path / "data" / wnid / f"img{i}.jpg")
    return tmp_path / "data"
