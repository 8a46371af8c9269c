"""Every lab switch set in this process (`env/switches.py`), checked at once by the code whose
meaning it changes: a command that would record the switches as in effect refuses a junk value
in one line before it runs, on the CPU too, where no kernel ever reads it.

Each check is imported only when its switch is set: the kernels' modules import Triton, which a
command run without switches need not load.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from quantstudy.env.switches import FP8_PROMOTE, GELU_ERF, GEMM_CONFIGS, TUNE_SCREEN, lab_switches


def _gemm_configs() -> object:
    from quantstudy.quant.kernels.tiles import gemm_config_limit

    return gemm_config_limit()


def _promote() -> object:
    from quantstudy.record.build_spec import checked_promote

    return checked_promote(os.environ[FP8_PROMOTE])


def _screen() -> object:
    from quantstudy.quant.kernels.search import screening

    return screening()


def _gelu_erf() -> object:
    from quantstudy.quant.kernels.epilogue import gelu_erf_form

    return gelu_erf_form()


# switch -> its own check (a `UserError` of one line for a value it does not take)
CHECKS: dict[str, Callable[[], object]] = {
    GEMM_CONFIGS: _gemm_configs,
    FP8_PROMOTE: _promote,
    TUNE_SCREEN: _screen,
    GELU_ERF: _gelu_erf,
}


def check_lab_switches() -> None:
    """Refuse the first lab switch set to a value its code does not take; nothing where none
    is set."""
    for name in lab_switches():
        CHECKS[name]()
