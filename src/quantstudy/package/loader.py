"""Runs a package folder's own check script in a fresh, isolated interpreter (`python -I`,
quantstudy not importable), with the environment a package loader needs: shared by the build
(the manifest's sample fingerprints) and the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from quantstudy.package import manifest as mf
from quantstudy.record.errors import UserError


def mapped_libstdcxx() -> str | None:
    """The libstdc++ this process maps (it has imported torch), from /proc/self/maps; None
    off Linux or when none is mapped."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and "/libstdc++.so" in fields[-1]:
            return fields[-1]
    return None


def loader_env() -> tuple[dict[str, str], str | None]:
    """The environment a package loader starts with, and the library it preloads.

    An AOTInductor package's `wrapper.so` has no NEEDED entry for libstdc++: its C++ symbols
    (the `std::regex` and locale code with which it parses its device string) bind to whichever
    loaded library exports them first. On the GPU image this project uses that was not
    libstdc++, and every CUDA package crashed at load (docs/package.md); preloading the
    libstdc++ that torch itself runs with makes them bind to it. Harmless where they would
    have anyway."""
    env = dict(os.environ)
    lib = mapped_libstdcxx()
    if lib is not None:
        env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD")) if p)
    return env, lib


def run_script(folder: Path, *args: str, timeout: float = 3600) -> dict[str, Any]:
    """Run the folder's check script in an isolated interpreter; its JSON result, with the
    library the loader preloaded (`loader_env`). A binding mismatch or a crash is one clear
    line (a `UserError`)."""
    env, preloaded = loader_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-I", str(folder / mf.CHECK_SCRIPT), str(folder), *args]
        done = subprocess.run(
            [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=timeout, env=env
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
            how = f"exit status {done.returncode}"
            if done.returncode < 0:
                how = f"killed by signal {-done.returncode}"
            raise UserError(f"the packages in {folder} did not run ({how}): {lines[-1]}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["stdout"] = done.stdout
        result["preloaded"] = preloaded
        return result


def sample_outputs(folder: Path) -> dict[str, Any]:
    """The FP8 package's logits on the manifest's sample images, fingerprinted, computed by
    the folder's own script: the package loads and runs without quantstudy."""
    with tempfile.TemporaryDirectory() as tmp:
        logits_path = Path(tmp) / "logits.pt"
        result = run_script(folder, "--logits", str(logits_path))
        logits = torch.load(logits_path)
    return {
        "logits_sha256": mf.logits_sha256(logits),
        "top1": logits.argmax(dim=1).tolist(),
        "load_s": result["load_s"],
        "loaded_with_LD_PRELOAD": result["preloaded"],
    }
