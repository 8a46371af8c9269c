"""What a measured x may claim in a table: whether its rounds settle the sign of the gain,
whether an engine's timings were noisy, and whether the two ways of reading the rounds agree.

Every table that shows an x (the study report, the zoo page and CSV, the sweep summary, the
bench tables) reads it through `XClaim`, so one rule decides everywhere:
- An x whose interval [q1, q3] contains 1.0 is *not settled* (the rule of the study's own
  warning, `speed/stats.py: sign_unsupported`): the rounds do not say whether FP8 is faster.
  It is shown marked, never ranked, never counted in a median or a "most / least" claim, and
  no fraction of the ideal is shown for it.
- x is the median of the per-round ratios fp16/FP8 (`speed/stats.py` says why); the ms shown beside
  it are each engine's median over the same rounds, and their quotient (the ratio of the
  medians) need not equal x. Tables say so under them (`ESTIMATORS`) and mark a row where the
  two fall on different sides of 1.0.
- An engine whose IQR / median exceeds `speed/stats.py: MAX_RELATIVE_SPREAD` is noisy, and
  fewer rounds than its `MIN_ROUNDS` give no spread; both are marked.
Nothing here measures: it reads figures a record already holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantstudy.record import BatchSpeed
from quantstudy.record.vocab import Engine
from quantstudy.speed.stats import (
    MAX_RELATIVE_SPREAD,
    MIN_ROUNDS,
    relative_spread,
    sign_unsupported,
)

NOT_SETTLED = "not settled"
DISAGREES = "ms ratio disagrees"
FEW_ROUNDS = "few rounds"
NOT_MEASURED_X = "not measured"  # an x that is not a finite number (never "nan [q1, q3]")

ESTIMATORS = (
    "x is the median over round pairs of fp16 ms / FP8 ms, [q1, q3] its quartiles; each ms "
    "is that engine's median over the same rounds, so fp16 ms / FP8 ms need not equal x."
)
# What each mark means, in words only: a study report may print no number its record lacks
X_ONLY = (
    "x is the median over round pairs of fp16 ms / the engine's ms, over the same interleaved "
    "rounds."
)
LEGEND = {
    NOT_SETTLED: "the interval [q1, q3] reaches both sides of x = one, so these rounds do not "
    "support the sign of the gain: not ranked, left out of every median and most / least claim",
    DISAGREES: "the ratio of the two ms medians falls on the other side of x = one from x",
    "noisy": "an engine's timings spread (IQR / median) over the study's bound",
    FEW_ROUNDS: "fewer rounds than the study's minimum: the quartiles are not a spread",
}


def noisy_tag(engine: str) -> str:
    return f"noisy {engine}"


@dataclass(frozen=True)
class XClaim:
    """One x (fp16 ms / FP8 ms at one batch) as a table may show it."""

    x: float  # median of the per-round ratios
    q1: float
    q3: float
    fp16_ms: float | None = None  # each engine's median over the same rounds; None: not kept
    fp8_ms: float | None = None
    fp16_spread: float | None = None  # IQR / median of the engine's rounds; None: not kept
    fp8_spread: float | None = None
    rounds: int | None = None

    @property
    def measured(self) -> bool:
        """x and its interval are numbers (a NaN is shown as not measured)."""
        return all(math.isfinite(v) for v in (self.x, self.q1, self.q3))

    @property
    def settled(self) -> bool:
        """The rounds support the sign of the gain: [q1, q3] lies on one side of 1.0."""
        return self.measured and not sign_unsupported(self.q1, self.q3)

    @property
    def ratio_of_medians(self) -> float | None:
        if self.fp16_ms is None or self.fp8_ms is None or not self.fp8_ms > 0:
            return None
        return self.fp16_ms / self.fp8_ms

    @property
    def estimators_disagree(self) -> bool:
        """x and the ratio of the medians fall on different sides of 1.0."""
        rom = self.ratio_of_medians
        return self.measured and rom is not None and (self.x - 1.0) * (rom - 1.0) < 0

    @property
    def noisy(self) -> list[str]:
        """The engines whose timings spread over the bound."""
        spreads = ((Engine.FP16, self.fp16_spread), (Engine.FP8, self.fp8_spread))
        return [str(e) for e, s in spreads if s is not None and s > MAX_RELATIVE_SPREAD]

    def tags(self) -> list[str]:
        """The short marks a table cell carries after x; empty for clean evidence."""
        if not self.measured:
            return []
        found = [] if self.settled else [NOT_SETTLED]
        found += [noisy_tag(e) for e in self.noisy]
        if self.rounds is not None and self.rounds < MIN_ROUNDS:
            found.append(FEW_ROUNDS)
        if self.estimators_disagree:
            found.append(DISAGREES)
        return found

    def cell(self, interval: str) -> str:
        """`interval` (x and [q1, q3] as the table formats them) with the claim's marks."""
        if not self.measured:
            return NOT_MEASURED_X
        tags = self.tags()
        return f"{interval} ({', '.join(tags)})" if tags else interval

    def sentences(self) -> list[str]:
        """The marks as sentences, for a CSV cell or a list under a table."""
        said = []
        if not self.measured:
            return ["x is not a finite number: not measured"]
        if not self.settled:
            said.append(
                f"the interval of x [{self.q1:.3f}, {self.q3:.3f}] contains 1.0; these rounds "
                "do not support the sign of the gain"
            )
        if self.fp16_spread is not None and self.fp16_spread > MAX_RELATIVE_SPREAD:
            said.append(f"fp16 timings are noisy: IQR/median {self.fp16_spread:.1%}")
        if self.fp8_spread is not None and self.fp8_spread > MAX_RELATIVE_SPREAD:
            said.append(f"fp8 timings are noisy: IQR/median {self.fp8_spread:.1%}")
        if self.rounds is not None and self.rounds < MIN_ROUNDS:
            said.append(f"only {self.rounds} rounds (fewer than {MIN_ROUNDS})")
        return said + self.disagreement()

    def disagreement(self) -> list[str]:
        """The sentence of ms medians whose ratio falls on the other side of 1.0 from x."""
        rom = self.ratio_of_medians
        if not self.estimators_disagree or rom is None:
            return []
        return [
            f"fp16 ms / FP8 ms of the medians is {rom:.3f}, on the other side of 1.0 "
            f"from x {self.x:.3f} (the median of the per-round ratios)"
        ]

    def ideal(self, ideal_x: float | None) -> str | None:
        """This x as a fraction of the ideal x; None without an ideal. Not a percentage for an
        x that is not settled, nor one over 100% (the measurement beat the model of the limit:
        it says so instead)."""
        if ideal_x is None or not math.isfinite(ideal_x) or ideal_x <= 0:
            return None
        if not self.settled:
            return f"x {NOT_SETTLED}"
        if self.x >= ideal_x:
            return f"at or over the ideal {ideal_x:.2f}"
        return f"{self.x / ideal_x:.0%} of {ideal_x:.2f}"


def claim_of(b: BatchSpeed) -> XClaim:
    """The claim of one batch of a study's (or a bench's) speed section."""
    return XClaim(
        x=b.ratio.median,
        q1=b.ratio.q1,
        q3=b.ratio.q3,
        fp16_ms=b.fp16_ms.median,
        fp8_ms=b.fp8_ms.median,
        fp16_spread=relative_spread(b.fp16_ms),
        fp8_spread=relative_spread(b.fp8_ms),
        rounds=b.ratio.n,
    )


def legend(claims: list[XClaim], ms_shown: bool = True) -> list[str]:
    """The lines under a table: the estimators (`ESTIMATORS`; `X_ONLY` for a table that shows
    no ms beside x), then what each mark the table uses means."""
    used = {t.split(" ")[0] if t.startswith("noisy") else t for c in claims for t in c.tags()}
    said = [f"*{tag}*: {why}" for tag, why in LEGEND.items() if tag in used]
    lead = ESTIMATORS if ms_shown else X_ONLY
    return [lead + (" Marks: " + "; ".join(said) + "." if said else "")]
