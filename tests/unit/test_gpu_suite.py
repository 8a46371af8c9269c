"""The GPU suite runner (tools/gpu_suite.py): its record (counts, failures and skips by reason,
read from the JUnit XML pytest writes), its parts (every test file in exactly one) and the merge
of the parts' records into one record of one commit."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_suite.py"
pytestmark = pytest.mark.committed("tools/gpu_suite.py")


def _tool():
    if str(TOOL.parent) not in sys.path:  # as when it runs as a script: its sibling modules
        sys.path.insert(0, str(TOOL.parent))
    spec = importlib.util.spec_from_file_location("gpu_suite", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
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


def test_every_test_file_is_in_exactly_one_part():
    """A part per device call: a file in no part would never run on the GPU machine, a file in
    two would count twice."""
    found = _tool().assignments()
    assert len(found) > 100 and "tests/gpu/test_package_gpu.py" in found
    assert {f: where for f, where in found.items() if len(where) != 1} == {}


def test_a_test_file_no_part_names_is_found(tmp_path):
    tool = _tool()
    for f in ("tests/unit/test_a.py", "tests/gpu/test_package_gpu.py", "tests/zoo/test_new.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    found = tool.assignments(tmp_path)
    assert found["tests/zoo/test_new.py"] == []
    assert found["tests/gpu/test_package_gpu.py"] == ["package/package"]
    assert found["tests/unit/test_a.py"] == ["kernels/cpu"]


def _part(tool, name: str, commit: str = "abc1234", failed: int = 0, complete: bool = True):
    """A part's record as run_part writes it, with one group per group of the part."""
    part = next(p for p in tool.PARTS if p.name == name)
    groups = [
        {"group": g.name, "command": "pytest ...", "rc": 0 if complete else "timeout",
         "wall_s": 10.0, "tests": 3, "passed": 2 - failed, "failed": failed, "errors": 0,
         "skipped": 1, "failures": [], "skips": {"no CUDA GPU on this machine": 1}, "slowest": []}
        for g in part.groups
    ]  # fmt: skip
    record = {"what": "...", "part": name, "marks": "not evidence", "gpu": "NVIDIA H200",
              "gpus": 1, "driver": "580.159.04", "cpus": 16, "platform": "Linux",
              "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"}, "commit": commit,
              "wall_s": 10.0 * len(groups), "groups": groups, "complete": complete}  # fmt: skip
    return record | {k: sum(g[k] for g in groups) for k in tool.COUNTS}


def test_merge_builds_one_record_of_every_part():
    tool = _tool()
    parts = [_part(tool, p.name) for p in reversed(tool.PARTS)]
    record = tool.merge(parts)
    n = sum(len(p.groups) for p in tool.PARTS)
    assert record["complete"] and record["parts_not_run"] == [] and tool.green(record)
    assert (record["tests"], record["passed"], record["skipped"]) == (3 * n, 2 * n, n)
    assert [g["part"] for g in record["groups"]] == [
        p.name for p in tool.PARTS for _ in p.groups
    ]  # in the order of PARTS, whatever the order given
    assert [p["part"] for p in record["parts"]] == [p.name for p in tool.PARTS]
    assert all(p["ran"] and p["complete"] for p in record["parts"])
    # the keys the README's record test and the README read
    for key in ("commit", "versions", "failed", "errors", "complete", "tests", "passed"):
        assert key in record


def test_a_part_that_did_not_run_is_named_and_never_counted():
    tool = _tool()
    first, *rest = tool.PARTS
    record = tool.merge([_part(tool, p.name) for p in rest])
    assert record["parts_not_run"] == [first.name] and not record["complete"]
    assert not tool.green(record)  # no failure, yet not green: a part is missing
    assert record["tests"] == 3 * sum(len(p.groups) for p in rest)
    assert {p["part"]: p["ran"] for p in record["parts"]}[first.name] is False


def test_a_stopped_or_failing_part_is_not_green():
    tool = _tool()
    names = [p.name for p in tool.PARTS]
    stopped = tool.merge([_part(tool, n, complete=n != names[0]) for n in names])
    assert not stopped["complete"] and stopped["parts_not_run"] == []
    failing = tool.merge([_part(tool, n, failed=int(n == names[-1])) for n in names])
    assert failing["complete"] and failing["failed"] > 0 and not tool.green(failing)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r | {"commit": "def5678"}, "differ in commit"),
        (lambda r: r | {"versions": {"torch": "2.14.1"}}, "differ in versions"),
        (lambda r: r | {"part": "everything"}, "a record of part 'everything'"),
    ],
)
def test_merge_refuses_parts_that_are_not_one_record(change, said):
    tool = _tool()
    names = [p.name for p in tool.PARTS]
    records = [_part(tool, n) for n in names[:-1]] + [change(_part(tool, names[-1]))]
    with pytest.raises(tool.MergeError, match=said):
        tool.merge(records)
    with pytest.raises(tool.MergeError, match="given twice"):
        tool.merge([_part(tool, names[0]), _part(tool, names[0])])


def test_merge_command_writes_the_record_or_refuses_in_one_line(tmp_path, capsys):
    tool = _tool()
    paths = []
    for p in tool.PARTS:
        paths.append(tmp_path / f"gpu-suite-{p.name}.json")
        paths[-1].write_text(json.dumps(_part(tool, p.name)))
    out = tmp_path / "gpu-suite.json"
    assert tool.main(["merge", *map(str, paths), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["complete"]
    assert tool.main(["merge", *map(str, paths[1:]), "--out", str(out)]) == 1  # one missing
    assert json.loads(out.read_text())["parts_not_run"] == [tool.PARTS[0].name]
    (tmp_path / "junk.json").write_text("[1, 2]")
    capsys.readouterr()
    assert tool.main(["merge", str(tmp_path / "junk.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "junk.json is not a part's record" in err[0]


def test_a_part_writes_its_record_as_it_ends(tmp_path, monkeypatch):
    """A real pytest run per group, the second stopped at its limit: the part's record says
    which tests ended (the one the stop interrupted counts in no column: pytest's JUnit XML
    lists it without a name) and that the part did not end by itself. The limit counts from
    the end of pytest's start-up, here made longer than the limit (a loaded machine's), so
    the first test always ends; the second sleeps past any limit, so only the stop ends it."""
    tool = _tool()
    (tmp_path / "conftest.py").write_text("import time\ntime.sleep(4)  # a slow start-up\n")
    (tmp_path / "test_quick.py").write_text("def test_ok(): pass\n")
    (tmp_path / "test_long.py").write_text(
        "import time\ndef test_ok(): pass\ndef test_slow(): time.sleep(600)\n"
    )
    monkeypatch.setattr(tool, "JUNIT", tmp_path / "junit")
    monkeypatch.setattr(tool, "machine", lambda env: {"gpu": None, "commit": "abc1234"})
    (tmp_path / "junit").mkdir()
    part = tool.Part("demo", (
        tool.Group("quick", (str(tmp_path / "test_quick.py"),)),
        tool.Group("long", (str(tmp_path / "test_long.py"),), limit=3),
    ))  # fmt: skip
    opts = SimpleNamespace(marks="not evidence", scale=1.0, budget=60)
    (tmp_path / "out").mkdir()
    record = tool.run_part(part, tmp_path / "out", dict(os.environ), opts)
    written = json.loads((tmp_path / "out" / "gpu-suite-demo.json").read_text())
    assert written == json.loads(json.dumps(record))
    by_group = {g["group"]: g for g in written["groups"]}
    assert by_group["quick"]["rc"] == 0 and by_group["quick"]["passed"] == 1
    assert by_group["long"]["rc"] == "timeout" and by_group["long"]["passed"] == 1
    assert by_group["long"]["startup_s"] >= 4 and by_group["long"]["wall_s"] < 60
    assert not written["complete"] and written["part"] == "demo"
