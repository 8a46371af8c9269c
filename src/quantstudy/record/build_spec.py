"""What an FP8 engine computes, as one frozen value built once and passed down (`BuildSpec`).

An FP8 engine's numbers and speed depend on more than its plan: which product backend runs its
real layers (or "fastest", a choice per layer), how the products sum, the lab switches set when
it was built and which rewrites it makes. Each of those read where it is used (a process-wide
stack, an environment variable read at launch, a keyword flag) would be a build option nobody
passed, which no cache could key on. The spec holds them all; a study builds it once from its
config and the environment (`StudyConfig.build_spec`), and the engine builders, the layers and
the kernel launches receive it or the field they need (a layer's `FP8LayerSpec.promote`). Every
cache that holds something measured or tuned for an engine keys on `BuildSpec.key()`.

How the products sum (the accumulation). Hopper's FP8 tensor cores keep about 14 bits of a
running sum. Left there for the whole of K (interval 0: cuBLASLt's fast accumulation, what
torchao's float8 configs use) the products run faster on large K; moved to float32 every 128
products (`PROMOTE`, cuBLASLt with `use_fast_accum=False`, DeepSeek-V3's scheme) the sums keep
float32's precision past the first K tile. The engines sum fast by default
(`DEFAULT_ACCUMULATION`): faster, and no worse in quality where both were compared (why:
docs/fp8-kernel.md, "Fast accumulation as the default"), and every study measures its own
engine's quality anyway. A study chooses with `--fp8-accumulate`, a bench with the lab switch
`QUANTSTUDY_FP8_PROMOTE` (any power of two from 16, for the lab).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, field_validator, model_validator

from quantstudy.env.switches import FP8_PROMOTE, lab_switches
from quantstudy.record.base import Section
from quantstudy.record.engines import KernelChoice
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import FASTEST, Accumulation

# Products summed in the tensor cores before float32 takes over: one K tile of cuBLASLt's FP8
# kernels (torch._scaled_mm, use_fast_accum=False).
PROMOTE = 128
# The interval of each accumulation a study may ask for (0: all of K in the tensor cores).
INTERVALS = {Accumulation.PROMOTE128: PROMOTE, Accumulation.FAST: 0}
# What a study that names none takes (the module docstring says why), and what the engines of
# every record before schema version 21 did, which leave `fp8_accumulate` out or null.
DEFAULT_ACCUMULATION = Accumulation.FAST
BEFORE_21 = Accumulation.PROMOTE128
# The backend an engine is built with when nothing names one, and the one a choice per layer
# starts from (`quant/backends/`: its registry checks that the name is registered).
DEFAULT_BACKEND = "fused"


def checked_promote(value: str, source: str = FP8_PROMOTE) -> int:
    """A promotion interval given as text: 0 (fast accumulation) or a power of two, 16 or
    more (at least one tile's K step); anything else is one clear line."""
    n = int(value) if value.isdigit() else -1
    if n != 0 and (n < 16 or n & (n - 1)):
        raise UserError(
            f"{source}={value!r}: give 0 (fast accumulation) or a power of two, 16 or more"
        )
    return n


def promote_of(
    accumulate: Accumulation | None, switches: Mapping[str, str], *, recorded: bool = False
) -> int:
    """The promotion interval of an engine: `accumulate`'s where given, else the lab switch's
    (`switches`: those set when the engine is built, or those a recorded study ran under), else
    the default: `DEFAULT_ACCUMULATION` for a new engine, `BEFORE_21` for one rebuilt from a
    record (`recorded`) whose config names none, as every engine before schema 21 summed."""
    if accumulate is not None:
        return INTERVALS[Accumulation(accumulate)]
    if switches.get(FP8_PROMOTE):
        return checked_promote(switches[FP8_PROMOTE])
    return INTERVALS[BEFORE_21 if recorded else DEFAULT_ACCUMULATION]


class BuildSpec(Section):
    """What an FP8 engine computes (module docstring): one frozen value, passed down unchanged.

    `kernel`: the product backend every real layer runs (a name of `quant/backends/`), or
    "fastest" with its `choice` (timed at some batches, or a recorded choice replayed).
    `promote`: products the tensor cores sum before float32 takes over (0: all of K, fast
    accumulation). `switches`: the lab switches (`env/switches.py`) set when the spec was
    built, by name. `residual`, `sum_handoff`, `pad_outputs`: the rewrites
    (`engines/builders.py: build_fp8` documents each)."""

    kernel: str = DEFAULT_BACKEND
    choice: KernelChoice | None = None
    promote: int = Field(INTERVALS[DEFAULT_ACCUMULATION], ge=0)
    switches: tuple[tuple[str, str], ...] = ()
    residual: bool = True
    sum_handoff: bool = False
    pad_outputs: bool = True

    @field_validator("switches", mode="before")
    @classmethod
    def _sorted(cls, value: Any) -> Any:
        """Switches by name, in one order, so two specs with the same switches are equal."""
        items = value.items() if isinstance(value, Mapping) else value
        return tuple(sorted((str(k), str(v)) for k, v in items))

    @model_validator(mode="after")
    def _choice_with_fastest(self) -> Self:
        if (self.kernel == FASTEST) != (self.choice is not None):
            raise ValueError('a kernel choice goes with the kernel option "fastest", and only')
        checked_promote(str(self.promote), "promote")
        return self

    @classmethod
    def made(
        cls,
        kernel: str | KernelChoice = DEFAULT_BACKEND,
        accumulate: Accumulation | None = None,
        *,
        switches: Mapping[str, str] | None = None,
        recorded: bool = False,
        **rewrites: bool,
    ) -> BuildSpec:
        """A spec for `kernel` (a backend's name or a `KernelChoice`), summing as `accumulate`
        says (`promote_of`), under `switches` (default: the lab switches set in this process,
        read here, once), with the `rewrites` (`residual`, `sum_handoff`, `pad_outputs`)."""
        switched = lab_switches() if switches is None else dict(switches)
        promote = promote_of(accumulate, switched, recorded=recorded)
        common = {"promote": promote, "switches": switched, **rewrites}
        if isinstance(kernel, KernelChoice):
            return cls(kernel=FASTEST, choice=kernel, **common)
        return cls(kernel=kernel, **common)

    def but(self, **changes: Any) -> BuildSpec:
        """A copy with `changes`, validated again (`model_copy` does not validate)."""
        return BuildSpec.model_validate(self.model_dump() | changes)

    @property
    def backend(self) -> str:
        """The backend an engine of this spec is built with: its kernel, or for a choice per
        layer the default one (the choice swaps in another backend's module where it wins)."""
        return DEFAULT_BACKEND if self.choice is not None else self.kernel

    @property
    def accumulation(self) -> Accumulation | None:
        """How the products sum, by name; None for a lab interval that has none."""
        return next((mode for mode, n in INTERVALS.items() if n == self.promote), None)

    @property
    def fast_accumulation(self) -> bool:
        """All of K in the tensor cores (cuBLASLt's `use_fast_accum`); any promotion but 0
        leaves cuBLASLt at its own 128."""
        return self.promote == 0

    def key(self) -> str:
        """What a cache of anything measured or tuned for an engine keys on: a digest of the
        whole spec, so that two specs never share an entry."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
