"""How the engines' FP8 products accumulate: how many products the tensor cores sum before the
sums move to float32.

Hopper's FP8 tensor cores keep about 14 bits of a running sum. Left there for the whole of K
(interval 0: cuBLASLt's fast accumulation, what torchao's float8 configs use) the products run
3 to 20% faster on large K (docs/fp8-kernel.md); moved to float32 every 128 products (`PROMOTE`,
cuBLASLt with `use_fast_accum=False`, DeepSeek-V3's scheme) the sums keep float32's precision
past the first K tile. The engines sum fast by default (`DEFAULT`): on the H100, Lite0 with its
real weights agreed with fp32 on 1,232 of 1,300 held-out images summing fast and 1,227 promoting
(`docs/results/checks/accumulation-lite0-h100-760cbc9.json`), and every study measures its own
engine's quality anyway. A study chooses with `--fp8-accumulate` (`accumulating`), a bench with
the lab switch `QUANTSTUDY_FP8_PROMOTE`; either applies to every FP8 product an engine runs: the
Triton kernels' PROMOTE and torch._scaled_mm's `use_fast_accum`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from quantstudy.record.errors import UserError
from quantstudy.record.switches import FP8_PROMOTE
from quantstudy.record.vocab import Accumulation

if TYPE_CHECKING:
    from quantstudy.record.inputs import StudyConfig

# Products summed in the tensor cores before float32 takes over: one K tile of cuBLASLt's FP8
# kernels (torch._scaled_mm, use_fast_accum=False).
PROMOTE = 128
# The interval of each accumulation a study may ask for (0: all of K in the tensor cores).
INTERVALS = {Accumulation.PROMOTE128: PROMOTE, Accumulation.FAST: 0}
# What a study that names none takes (the module's docstring says why), and what the engines of
# every record before schema version 21 did, which leave `fp8_accumulate` out or null.
DEFAULT = Accumulation.FAST
BEFORE_21 = Accumulation.PROMOTE128

F = TypeVar("F", bound=Callable[..., Any])
_SET: list[int] = []  # the intervals of the enclosing `accumulating` blocks


@contextmanager
def accumulating(mode: Accumulation | None) -> Iterator[None]:
    """Within the block every FP8 product an engine builds or runs sums as `mode` says (None:
    as the lab switch or the default say): a study's `--fp8-accumulate`, set around the whole
    study, its package and its extension, so that every engine of it sums alike."""
    if mode is None:
        yield
        return
    _SET.append(INTERVALS[Accumulation(mode)])
    try:
        yield
    finally:
        _SET.pop()


def accumulates_as(mode_of: Callable[..., Accumulation | None]) -> Callable[[F], F]:
    """A decorator: the function runs within `accumulating(mode_of(its arguments))`."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with accumulating(mode_of(*args, **kwargs)):
                return fn(*args, **kwargs)

        return cast(F, run)

    return wrap


def engine_promote() -> int:
    """The engines' promotion interval: the enclosing `accumulating` block's, else
    `$QUANTSTUDY_FP8_PROMOTE` where set (0: all of K in the tensor cores; else a power of two,
    16 or more, at least one tile's K step), else DEFAULT's."""
    if _SET:
        return _SET[-1]
    value = os.environ.get(FP8_PROMOTE)
    if not value:
        return INTERVALS[DEFAULT]
    n = int(value) if value.isdigit() else -1
    if n != 0 and (n < 16 or n & (n - 1)):
        raise UserError(
            f"{FP8_PROMOTE}={value!r}: give 0 (fast accumulation) or a power of two, 16 or more"
        )
    return n


def fast_accumulation() -> bool:
    """Whether torch._scaled_mm sums all of K in the tensor cores (`use_fast_accum`). It has no
    interval of its own: any promotion but 0 leaves it at cuBLASLt's 128."""
    return engine_promote() == 0


def in_effect() -> Accumulation | None:
    """The accumulation the engines built now take (`engine_promote`), by name; None for a lab
    interval that has none (the record's lab switches say which)."""
    promote = engine_promote()
    return next((mode for mode, n in INTERVALS.items() if n == promote), None)


def recorded(config: StudyConfig, lab_switches: dict[str, str] | None) -> Accumulation | None:
    """How a recorded study's engines summed, for building them again (its package, its
    extension): its config's accumulation; where it has none, the lab switch the study ran
    under (None: set again, the switch decides), else what every engine did before version 21."""
    if config.fp8_accumulate is not None:
        return config.fp8_accumulate
    return None if lab_switches and FP8_PROMOTE in lab_switches else BEFORE_21
