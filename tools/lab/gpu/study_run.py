"""One `quantstudy run` on the GPU as the lab's device scripts run it (`package_bench.py`,
`accumulation.py`): the same flags from their common options, in a subprocess, timed."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run_cuda_study(
    args: argparse.Namespace,
    model: str,
    weights: str,
    recipe: str | None,
    out: Path,
    batches: str = "1,128",
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the study into `out` (`args`: calib, heldout, data, calib_data, class_list); its
    command, exit status and wall seconds. Exits the script, with the study's last stderr,
    where no study.json was written."""
    cmd = [sys.executable, "-m", "quantstudy.cli", "run", model, "--weights", weights]
    cmd += ["--device", "cuda", "--batches", batches, "--calib", str(args.calib)]
    cmd += ["--heldout", str(args.heldout), "--data", str(args.data), "--out", str(out)]
    cmd += ["--calib-data", str(args.calib_data)] if args.calib_data else []
    cmd += ["--class-list", str(args.class_list)] if args.class_list else []
    cmd += ["--recipe", recipe] if recipe else []
    cmd += list(extra)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    info = {"command": " ".join(cmd), "exit": done.returncode}
    info["wall_s"] = round(time.perf_counter() - start, 1)
    if not (out / "study.json").is_file():
        raise SystemExit(
            f"the study did not finish (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return info
