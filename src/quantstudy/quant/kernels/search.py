"""How a tuned launch times its pruned configs: each screened from a short CUDA graph, then the
few fastest timed at full length, and the fastest of those kept.

Timing is most of what a cold tune holds the GPU for, and in a zoo run on one GPU the studies
queue for it (`gpu/timing_lock.py`; what a cold tune costs: docs/fp8-kernel.md, "What a cold
tune costs"). A full timing captures about `FULL_MS` of launches in a graph and replays it
ten times (`gpu/timer.py`); ranking configs that differ widely needs far less. So every config
is first timed from a graph of about `SCREEN_MS` of launches, and only the `FINALISTS` fastest
are timed at full length: the choice among close configs is made at full precision, and a
config the screen puts outside them is one it timed slower than three others (where only by
the screen's noise, it was close to them anyway). What the screen saves and costs on the GPU:
docs/fp8-kernel.md, "The screen"; `QUANTSTUDY_TUNE_SCREEN=0` times every config at full
length, to compare.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quantstudy.env.switches import TUNE_SCREEN
from quantstudy.gpu.timer import time_ms
from quantstudy.quant.kernels.tiles import Config
from quantstudy.record.errors import UserError

# How many screened configs are timed at full length.
FINALISTS = 3
# Milliseconds of launches in a screening graph, and in a full timing's (`gpu/timer.py: rep`):
# short, since a cold tune times a few dozen configs per product, each graph captured from
# Python one launch at a time.
SCREEN_MS = 1
FULL_MS = 5

Call = Callable[[], object]  # one launch of a config, arguments bound
Timer = Callable[[Call], float]  # its time per launch, in ms


def screen_time(fn: Call) -> float:
    """A config's median time from a graph of about `SCREEN_MS` of launches."""
    return time_ms(fn, rep=SCREEN_MS, stat="median")


def full_time(fn: Call) -> float:
    """A config's median time from a graph of about `FULL_MS` of launches."""
    return time_ms(fn, rep=FULL_MS, stat="median")


def screening() -> bool:
    """Whether tuned launches screen their configs: yes unless `$QUANTSTUDY_TUNE_SCREEN` is 0."""
    value = os.environ.get(TUNE_SCREEN, "")
    if value not in ("", "0", "1"):
        raise UserError(f"{TUNE_SCREEN}={value!r}: give 1 (screen configs, the default) or 0")
    return value != "0"


@dataclass(frozen=True)
class Found:
    """A search's outcome: the config it kept and what it timed (for the tuning log)."""

    best: Config
    screened: int  # configs timed from short graphs (0: too few to screen, or screening off)
    finalists: int  # configs timed at full length
    failed: int  # configs that could not launch here (shared memory, registers)


def fastest(configs: Sequence[Config], call: Callable[[Config], Call]) -> Found:
    """The fastest of `configs`, each launched through `call(config)()`. A config that cannot
    launch here (too much shared memory, a failed assembly) is passed over, as Triton's
    autotuner does; where none can, the first error of the last round that ran is raised."""
    screen_failures: list[Exception] = []
    final_failures: list[Exception] = []
    screened = len(configs) > FINALISTS and screening()
    kept = list(configs)
    if screened:
        times = _times(kept, call, screen_time, screen_failures)
        order = sorted((t, i) for i, t in enumerate(times) if math.isfinite(t))
        kept = [configs[i] for _, i in order[:FINALISTS]]
    final = _times(kept, call, full_time, final_failures)
    if not any(math.isfinite(t) for t in final):
        raise (final_failures or screen_failures)[0]
    best = kept[min(range(len(kept)), key=final.__getitem__)]
    failed = len(screen_failures) + len(final_failures)
    return Found(best, len(configs) if screened else 0, len(kept), failed)


def _times(
    configs: Sequence[Config],
    call: Callable[[Config], Call],
    timer: Timer,
    failures: list[Exception],
) -> list[float]:
    """Each config's time by `timer`; infinite where it cannot launch (the error kept)."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    times = []
    for config in configs:
        try:
            times.append(timer(call(config)))
        except (OutOfResources, CompileTimeAssertionFailure, PTXASError) as exc:
            failures.append(exc)
            times.append(math.inf)
    return times
