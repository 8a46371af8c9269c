"""`--heldout auto[:MAX]`: held-out images in rounds, a look at the quality gates after each.

The streamed held-out pass (`heldout.py`) asks its stop rule after every chunk; here a chunk
is a round, and the rule takes a look (`decision/sequential.py: look`) with the per-image rows
so far, stopping as soon as every quality gate is settled. The looks, the round size, the
bound and why the study stopped go into the record's sequential section; the decision then
reads the quality gates from the last look (`decision/policy.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quantstudy.decision.schema import Policy
from quantstudy.decision.sequential import PerImage, look, make_section, settled
from quantstudy.quality.image_scores import RowSet
from quantstudy.record import Look, SequentialSection
from quantstudy.record.vocab import StopReason

# Held-out images per round (rounded down to whole eval batches): small enough that a gate
# settles soon after its evidence suffices, large enough that a look's cost does not matter.
ROUND_IMAGES = 256


def per_image(rows: RowSet, labels: np.ndarray | None) -> PerImage:
    """The sequential decision's view of the rows: a non-finite row's top-1 is a negative
    code of its own engine, so it is neither correct nor in agreement (as in `metrics.py`)."""
    top1 = {
        name: np.where(p.valid, p.top1, -1 - i) for i, (name, p) in enumerate(rows.engines.items())
    }
    return PerImage(
        top1=top1,
        labels=labels,
        kl={pair: r.kl for pair, r in rows.pairs.items()},
        nonfinite={name: ~p.valid for name, p in rows.engines.items()},
    )


@dataclass
class Rounds:
    """The stop rule of a sequential held-out pass; keeps every look it took."""

    policy: Policy
    looks: list[Look] = field(default_factory=list)

    def __call__(self, rows: RowSet, labels: np.ndarray | None) -> bool:
        previous = self.looks[-1] if self.looks else None
        now = look(per_image(rows, labels), self.policy, previous=previous)
        self.looks.append(now)
        return settled(now)

    def section(self, round_size: int, bound: int | None, taken: int) -> SequentialSection:
        """The record's section; `taken`: the held-out images the split gave the study (the
        bound, or every image the folder had left when fewer)."""
        reason = None
        if self.looks:
            if self.looks[-1].settled:
                reason = StopReason.SETTLED
            elif bound is not None and taken >= bound:
                reason = StopReason.UPPER_BOUND
            else:
                reason = StopReason.DATA_EXHAUSTED
        return make_section(self.policy, round_size, bound, self.looks, reason)
