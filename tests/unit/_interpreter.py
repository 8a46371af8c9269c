"""Run a Triton script on the CPU through Triton's interpreter, in a fresh Python process.

TRITON_INTERPRET must be set before Triton is first imported, which in the test process has
already happened; hence the subprocess.

`require_triton` decides whether a kernel test may skip: only where Triton is truly absent, that
is a torch build that does not declare it (CPU wheels). A torch that ships Triton (CUDA wheels on
Linux) and cannot import it is a broken install, and the kernel tests fail on it.
"""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch


def torch_declares_triton() -> bool:
    """Whether the installed torch lists Triton among its requirements on this platform."""
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    for requirement in requires:
        name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0].lower()
        if name in ("triton", "pytorch-triton"):
            marker = requirement.partition(";")[2].strip()
            if not marker or _marker_holds(marker):
                return True
    return False


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate({"extra": ""})


def require_triton() -> None:
    """Skip, loudly, where Triton is truly absent; fail where torch ships it and it is broken."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        if torch_declares_triton():
            pytest.fail(f"torch {torch.__version__} ships Triton but it does not import: {error}")
        pytest.skip(
            f"TRITON ABSENT: torch {torch.__version__} is a build without Triton; "
            "the interpreter kernel tests did not run",
            allow_module_level=True,
        )


def run_interpreted(script: str) -> list[str]:
    """The fields of the last line `script` prints; fails the test with its stderr if it fails."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1].split()
