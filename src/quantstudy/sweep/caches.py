"""Compiler caches shared by every study on a host: Inductor's FX graph and kernel caches and
Triton's compiled kernels, so the second study of a model (and of a kernel shape) compiles warm.

The folder is resolved on the host that runs the study (a Ray worker on another machine uses its
own disk): `$QUANTSTUDY_CACHE_DIR`, else `~/.cache/quantstudy`. A cache the user already points
torch or Triton to is kept.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "QUANTSTUDY_CACHE_DIR"


def host_cache_env() -> dict[str, str]:
    """Environment for a study subprocess: this host's Inductor and Triton cache folders."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "quantstudy")
    env = {}
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        env[var] = os.environ.get(var) or str(root / sub)
    return env
