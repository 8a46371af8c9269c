"""Tests that read the real data skip, naming the folder and why, where it is absent or holds no
image that opens (a machine carrying part of the data, a device call that carried none of a
folder); they never error on set-up. A test declares what it reads with the `shared` mark
(tests/conftest.py), and every test module that reads a folder of the data declares it."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

TESTS = Path(__file__).resolve().parents[1]
READS = re.compile(r'shared_data / "([^"]+)"')


def _declared(source: str) -> set[str]:
    """The arguments of every `pytest.mark.shared(...)` in `source`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == "shared":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return found


def test_every_module_that_reads_the_data_declares_what_it_reads():
    modules = [p for p in sorted(TESTS.rglob("test_*.py")) if p != Path(__file__).resolve()]
    undeclared = {}
    for module in modules:
        source = module.read_text()
        reads = set(READS.findall(source))
        if reads:
            undeclared[str(module.relative_to(TESTS))] = sorted(reads - _declared(source))
    assert len(undeclared) >= 4, "the data tests were not found"
    assert {m: r for m, r in undeclared.items() if r} == {}


def _conftest(data: Path):
    """tests/conftest.py as a module of its own, reading `data` as the real data."""
    spec = importlib.util.spec_from_file_location("conftest_under_test", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SHARED_DATA = data
    return module


def _item(*paths: str) -> SimpleNamespace:
    marks = [SimpleNamespace(args=paths)]
    return SimpleNamespace(iter_markers=lambda name: marks if name == "shared" else [])


def test_the_skip_names_the_folder_and_why(partial_data):
    conftest = _conftest(partial_data)
    assert conftest._data_skip(_item("val-1300"), has_data=True) is None
    said = conftest._data_skip(_item("val-1300", "calib-1000"), has_data=True)
    assert said == f"real data folder calib-1000 in {partial_data} holds no usable image"
    said = conftest._data_skip(_item("calib-1000", "classes.txt"), has_data=True)
    assert said == f"real data folder classes.txt absent in {partial_data}"
    assert conftest._data_skip(_item(), has_data=False).startswith("real data absent")


def _run(data: Path, module: str) -> str:
    """`pytest -rs` of a data module against `data` as the real data; its output."""
    env = dict(os.environ, QUANTSTUDY_SHARED_DATA=str(data))
    command = [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "-m", "slow"]
    done = subprocess.run(
        [*command, str(TESTS / "data" / module)], cwd=TESTS.parent, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    return done.stdout


@pytest.fixture
def partial_data(tmp_path) -> Path:
    """val-1300 with one image, calib-1000 with none that opens."""
    (tmp_path / "val-1300" / "n01440764").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "val-1300" / "n01440764" / "a.JPEG")
    (tmp_path / "calib-1000" / "n01440764").mkdir(parents=True)
    (tmp_path / "calib-1000" / "n01440764" / "a.JPEG").write_bytes(b"not an image")
    return tmp_path


@pytest.mark.suite  # a pytest run of its own: about 15 s of imports on 2 cores
def test_a_data_module_skips_and_never_errors_where_a_folder_has_no_image(partial_data):
    out = _run(partial_data, "test_fp8_lite0.py")
    assert f"real data folder calib-1000 in {partial_data} holds no usable image" in out
    assert " error" not in out and "skipped" in out.splitlines()[-1]
