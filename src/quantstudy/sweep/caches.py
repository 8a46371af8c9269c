"""Caches shared by every study on a host: Inductor's FX graph and kernel caches and Triton's
compiled kernels, so the second study of a model (and of a kernel shape) compiles warm, and the
calibration statistics (`study/calib_stats.py`), so a model's calibration images pass through
the fp32 model once per sweep whatever the recipes and calibrators.

The fp16 engine: it does not depend on the recipe (only on BatchNorm folding), so the second
study of a model finds its Inductor graph (FX graph and AOTAutograd caches; parameters are graph
inputs, not constants, so the key does not hold their values) and its Triton kernels here, and
compiles warm; each study process still traces the model with Dynamo. No engine object crosses
processes.

The folder is resolved on the host that runs the study (a Ray worker on another machine uses its
own disk): `$QUANTSTUDY_CACHE_DIR`, else `~/.cache/quantstudy`. A cache the user already points
torch or Triton to is kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantstudy.study.calib_stats import STATS_ENV

CACHE_ENV = "QUANTSTUDY_CACHE_DIR"
# Each cache's variable and its folder under the root
CACHE_FOLDERS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    STATS_ENV: "calibration",
}


def host_cache_env() -> dict[str, str]:
    """Environment for a study subprocess: this host's Inductor and Triton cache folders."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "quantstudy")
    return {var: os.environ.get(var) or str(root / sub) for var, sub in CACHE_FOLDERS.items()}


def caches_under(root: Path) -> dict[str, str]:
    """Every cache under `root` whatever this process points them to: a study that must start
    from caches it controls (cold, then warm from what the first left) gets these."""
    return {CACHE_ENV: str(root)} | {var: str(root / sub) for var, sub in CACHE_FOLDERS.items()}
