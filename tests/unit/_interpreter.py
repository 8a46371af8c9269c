"""Run a Triton script on the CPU through Triton's interpreter, in a fresh Python process.

TRITON_INTERPRET must be set before Triton is first imported, which in the test process has
already happened; hence the subprocess.
"""

import os
import subprocess
import sys
import textwrap


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
