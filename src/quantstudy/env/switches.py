"""The lab switches: environment variables that change what the engines compute or how they are
tuned, set only to measure a change before it becomes an option (docs/fp8-kernel.md).

Named here, below the record, so that every record a switched process writes can say so (a
study's environment, a bench record's provenance) without importing the kernels. A switch's
meaning and its check live with the code it changes; `quant/kernels/switches.py` runs every set
switch's check before a command starts, so a junk value is never recorded as in effect.
"""

from __future__ import annotations

import os

GEMM_CONFIGS = "QUANTSTUDY_GEMM_CONFIGS"  # `quant/kernels/tiles.py: gemm_config_limit`
FP8_PROMOTE = "QUANTSTUDY_FP8_PROMOTE"  # `record/build_spec.py: promote_of`
TUNE_SCREEN = "QUANTSTUDY_TUNE_SCREEN"  # `quant/kernels/search.py: screening`
GELU_ERF = "QUANTSTUDY_GELU_ERF"  # `quant/kernels/epilogue.py: gelu_erf_form`
LAB_SWITCHES = (GEMM_CONFIGS, FP8_PROMOTE, TUNE_SCREEN, GELU_ERF)


def lab_switches() -> dict[str, str]:
    """The lab switches set in this process, by name."""
    return {name: os.environ[name] for name in LAB_SWITCHES if os.environ.get(name)}


def switches_said(switches: dict[str, str] | None) -> str | None:
    """Switches as one string of NAME=VALUE words, as the records that hold strings keep them
    (a bench record's provenance, a zoo row's environment); None: none set."""
    return " ".join(f"{k}={v}" for k, v in sorted(switches.items())) if switches else None


def switches_read(said: str | None) -> dict[str, str]:
    """The switches `switches_said` wrote, by name (none for None)."""
    words = (said or "").split()
    return dict(word.split("=", 1) for word in words if "=" in word)
