"""A gate never passes on a number that is not finite (`decision/gates.py`): an interval with an
infinite or NaN end says nothing, and a speed-up that is not a finite number (trtexec times that
underflow, an edited record) leaves its gate inconclusive with the reason, never shipped."""

from __future__ import annotations

import math

import pytest
from _records import build_record

from quantstudy.decision.policy import decide, load_policy
from quantstudy.record.vocab import Direction, GateStatus, Missing, Outcome

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("low", "high"), [(INF, INF), (1.2, INF), (NAN, 1.3), (NAN, NAN), (-INF, 0.5)]
)
@pytest.mark.parametrize("direction", list(Direction))
def test_an_interval_that_is_not_finite_is_inconclusive(low, high, direction):
    from quantstudy.decision.gates import status_of

    assert status_of(low, high, 1.05, direction) == GateStatus.INCONCLUSIVE
    assert status_of(1.2, 1.3, 1.05, Direction.AT_LEAST) == GateStatus.PASS  # finite: as before


def test_an_infinite_speedup_never_ships():
    record = build_record(speedup={1: 1.12, 32: 1.09, 128: 1.10}, with_decision=False)
    sp = record.speed
    assert sp is not None
    broken = sp.batches[0].ratio.model_copy(update={"median": INF, "q1": INF, "q3": INF})
    batches = [sp.batches[0].model_copy(update={"ratio": broken}), *sp.batches[1:]]
    record = record.model_copy(update={"speed": sp.model_copy(update={"batches": batches})})
    policy, label = load_policy(None)
    decision = decide(record, policy, label)
    gate = next(g for g in decision.gates if g.name == "speed at batch 1")
    assert gate.status == GateStatus.INCONCLUSIVE and gate.missing == Missing.NOT_MEANINGFUL
    assert (
        gate.skipped_reason
        == "x inf [inf, inf] is not a finite number: the timings of batch 1 are broken"
    )
    assert decision.outcome != Outcome.SHIP
