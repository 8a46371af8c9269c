"""Shared test set-up: few threads (2-core CI machine), and the skips for data and GPU tests."""

from pathlib import Path

import pytest
import torch

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
