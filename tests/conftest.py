"""Shared test set-up: few threads (the 2-core CI machine's cores shared by the pytest-xdist
workers) and OpenMP waits asleep in the processes tests start, the skips for data and GPU
tests, and small stand-ins for inputs a test must not fetch (a foolbox-shaped wheel).

The real data is found as the product finds it (`quantstudy.data.demo`): `$QUANTSTUDY_SHARED_DATA`
when set (the GPU machine carries it inside the repository, under .carry/data/imagenet), else the
checkout's sibling `../shared/data/imagenet`."""

import functools
import io
import os
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

CORES = 2  # the CI machine's


def worker_threads() -> int:
    """Torch threads for this process: its share of the CI machine's cores, so that the pytest-xdist
    workers together use each core once (one thread each with two workers, 2 without xdist). A
    test module or test that sets its own count at import or in its body overrides it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, CORES // workers)


torch.set_num_threads(worker_threads())
# The processes tests start (studies of the reliability suite, a sweep's or a zoo's, with a
# thread per core of their own) wait for work asleep: OpenMP's default spin beside the other
# worker's processes took two 2-thread studies side by side 25 s where they take 8 s.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(
    os.environ.get("QUANTSTUDY_SHARED_DATA") or REPO.parent / "shared" / "data" / "imagenet"
).expanduser()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "committed(*paths): reads these committed files of the repository (examples/, docs/); "
        "skips, naming them, where they are absent (an installed copy of the tests)",
    )
    config.addinivalue_line(
        "markers",
        "shared(*paths): reads these folders (calib-1000, val-1300) or files (classes.txt) of the "
        "real data; skips, naming them, where the data is present without them or a folder holds "
        "no image that opens (a machine carrying part of it)",
    )


def _absent_committed(item) -> list[str]:
    marks = item.iter_markers("committed")
    return [p for mark in marks for p in mark.args if not (REPO / p).exists()]


def pytest_collection_modifyitems(config, items):
    has_data = SHARED_DATA.is_dir()
    if os.environ.get("QUANTSTUDY_SHARED_DATA") and not has_data:
        # asked for by name: a wrong path is a broken run, not a reason to skip the data tests
        raise pytest.UsageError(f"QUANTSTUDY_SHARED_DATA={SHARED_DATA} is not a folder")
    has_gpu = torch.cuda.is_available()
    for item in items:
        absent = _absent_committed(item)
        if absent:
            reason = f"needs the repository's committed {', '.join(absent)} (absent in this copy)"
            item.add_marker(pytest.mark.skip(reason=reason))
        if "tests/reliability/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.suite)
        if "tests/conformance/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.conformance)
        if "tests/data/" in str(item.fspath).replace("\\", "/") or item.get_closest_marker("data"):
            reason = _data_skip(item, has_data)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
        if "tests/gpu/" in str(item.fspath).replace("\\", "/") or item.get_closest_marker("gpu"):
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="no CUDA GPU on this machine"))


def _data_skip(item, has_data: bool) -> str | None:
    """Why a data test cannot run here, or None: the real data, or a folder it reads (its
    `shared` marks), is absent or holds no image that opens. Never an error on set-up."""
    if not has_data:
        return f"real data absent: {SHARED_DATA}"
    paths = [f for m in item.iter_markers("shared") for f in m.args]
    problems = {f: _shared_problem(f) for f in paths}
    missing = [f for f, problem in problems.items() if problem == "absent"]
    if missing:
        return f"real data folder {', '.join(missing)} absent in {SHARED_DATA}"
    empty = [f for f, problem in problems.items() if problem == "no image"]
    if empty:
        return f"real data folder {', '.join(empty)} in {SHARED_DATA} holds no usable image"
    return None


@functools.cache
def _shared_problem(name: str) -> str | None:
    """Why a test cannot read `name` of the real data: "absent", "no image" (a folder in which
    no file opens as an image: a partial copy, or what a device call left of it), or None. A
    file (`classes.txt`) need only exist."""
    path = SHARED_DATA / name
    if Path(name).suffix:
        return None if path.is_file() else "absent"
    if not path.is_dir():
        return "absent"
    files = (f for f in sorted(path.rglob("*")) if f.is_file() and not f.name.startswith("."))
    for file in files:  # the first that opens is enough: the study skips the others by name
        try:
            with Image.open(file) as image:
                image.verify()
            return None
        except (OSError, SyntaxError, ValueError):  # what Pillow raises for a file it cannot read
            continue
    return "no image"


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


# Labels of the stand-in wheel's 20 images: foolbox 3.3.4 has 243, 559 and 990 among its own.
FOOLBOX_LABELS = (243, 559, 438, 990, 949, 853, 609, 609, 915, 455, 541, 630, 741, 471, 129, 99,
                  251, 22, 317, 305)  # fmt: skip


@pytest.fixture
def foolbox_wheel(tmp_path) -> Path:
    """A wheel laid out as foolbox 3.3.4's (`foolbox/data/imagenet_<i>_<label>.jpg`, plus code the
    demo must ignore), with 20 small random JPEGs: the demo fallback without a download."""
    g = torch.Generator().manual_seed(1)
    wheel = tmp_path / "wheels" / "foolbox-3.3.4-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("foolbox/__init__.py", "")
        archive.writestr("foolbox/data/README.txt", "not an image")
        for i, label in enumerate(FOOLBOX_LABELS):
            pixels = (torch.rand(64, 64, 3, generator=g) * 255).to(torch.uint8).numpy()
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG")
            archive.writestr(f"foolbox/data/imagenet_{i:02d}_{label}.jpg", buffer.getvalue())
    return wheel
