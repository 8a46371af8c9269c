"""`examples/api.py` runs as documented and writes only into its folder; mypy passes on it
with the package's types; the README's Python section runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the real data as tests/conftest.py finds it (and the product: `quantstudy.data.demo`)
SHARED_DATA = Path(
    os.environ.get("QUANTSTUDY_SHARED_DATA") or REPO.parent / "shared" / "data" / "imagenet"
).expanduser()
EXAMPLE = REPO / "examples" / "api.py"
pytestmark = pytest.mark.committed("examples/api.py", "README.md")


def _clean_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """The environment with an empty home, so a file written outside the example's folder
    (a cache, a download) shows up there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "QUANTSTUDY_"))}
    # matplotlib's font cache is matplotlib's own, written on its first import anywhere
    env |= {"HOME": str(home), "MPLCONFIGDIR": str(home.parent / "mpl"), "OMP_NUM_THREADS": "1"}
    return env | extra


@pytest.mark.slow
def test_the_example_runs_and_writes_only_into_its_folder(tmp_path, foolbox_wheel) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    extra = {"PYTHONPATH": str(REPO)}
    if SHARED_DATA.is_dir():
        extra["QUANTSTUDY_SHARED_DATA"] = str(SHARED_DATA)
    else:
        extra["QUANTSTUDY_FOOLBOX_WHEEL"] = str(foolbox_wheel)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=work,
        env=_clean_env(home, extra),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FP8 logits: (2, 1000)" in done.stdout
    assert "study engine logits: (2, 1000)" in done.stdout
    assert re.search(r"decision: inconclusive", done.stdout)
    assert [p.name for p in work.iterdir()] == ["api-example"]
    assert (work / "api-example" / "study" / "study.json").is_file()
    assert not list(home.rglob("*")), "written outside the example's folder"


def test_mypy_passes_on_the_example() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", str(EXAMPLE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]


def _readme_python() -> str:
    """The README's "Python API" section's code block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Python API section holds one python block"
    return blocks[0]


def test_the_readme_python_section_runs_as_written(tmp_path, monkeypatch) -> None:
    """Its block runs on a tiny timm model and a random tensor of images, in a folder of its
    own (it writes nothing: a study is the example's, above)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(_readme_python(), "README.md", "exec"), namespace)
    assert type(namespace["fp8"]).__name__ == "EngineModule"
    assert not list(tmp_path.iterdir())
