"""The GPU suite runner's record (tools/gpu_suite.py): counts, failures and skips by reason,
read from the JUnit XML pytest writes."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_suite.py"
pytestmark = pytest.mark.committed("tools/gpu_suite.py")


def _tool():
    spec = importlib.util.spec_from_file_location("gpu_suite", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_counts_a_real_pytest_run(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='no CUDA GPU on this machine')\n"
        "def test_gpu_a(): pass\n"
        "@pytest.mark.skip(reason='no CUDA GPU on this machine')\n"
        "def test_gpu_b(): pass\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('fixture broke')\n"
        "def test_error(broken): pass\n"
    )
    junit = tmp_path / "junit.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    subprocess.run([*command, "test_sample.py"], cwd=tmp_path, capture_output=True, check=False)
    record = _tool().read_junit(junit)
    assert {k: record[k] for k in ("tests", "passed", "failed", "errors", "skipped")} == {
        "tests": 5, "passed": 1, "failed": 1, "errors": 1, "skipped": 2,
    }  # fmt: skip
    assert record["skips"] == {"no CUDA GPU on this machine": 2}
    kinds = {f["test"].split("::")[-1]: f["kind"] for f in record["failures"]}
    assert kinds == {"test_bad": "failed", "test_error": "errors"}
    assert any("one is not two" in f["message"] for f in record["failures"])


def test_a_group_that_wrote_nothing_says_so(tmp_path):
    record = _tool().read_junit(tmp_path / "absent.xml")
    assert record["tests"] == 0 and record["note"] == "no JUnit XML"


def test_a_stopped_group_is_counted_from_its_verbose_log(tmp_path):
    """A group stopped at its limit may leave no JUnit XML; its -v log (with and without
    pytest-xdist) still says which tests ended and how; the summary's repeat is not counted."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='no CUDA GPU on this machine')\n"
        "def test_gpu(): pass\n"
        "@pytest.mark.xfail(strict=True, reason='a withdrawn claim')\n"
        "def test_withdrawn(): assert 1 == 2\n"
    )
    log = tmp_path / "log.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    log.write_text(done.stdout + "[gw1] [ 80%] PASSED tests/gpu/test_x.py::test_on_a_worker\n")
    record = _tool().read_log(log)
    # the xfail counts as a skip, as in the JUnit XML
    assert {k: record[k] for k in ("tests", "passed", "failed", "errors", "skipped")} == {
        "tests": 5, "passed": 2, "failed": 1, "errors": 0, "skipped": 2,
    }  # fmt: skip
    assert [f["test"].split("::")[-1] for f in record["failures"]] == ["test_bad"]
    assert "stopped" in record["note"]
