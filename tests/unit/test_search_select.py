"""The budgeted choice: it never exceeds the budget, and is exact on small inputs."""

import itertools
import random

import pytest

from quantstudy.decision.schema import AgreementPolicy, KlPolicy, Policy, QualityPolicy
from quantstudy.record.errors import UserError
from quantstudy.search.select import (
    EXACT_MAX,
    LayerEvidence,
    budget_from_policy,
    predict,
    select_layers,
)

POLICY = Policy(
    quality=QualityPolicy(kl_mean=KlPolicy(max=0.02), agreement=AgreementPolicy(min=0.97))
)


def _random_evidence(n: int, seed: int) -> list[LayerEvidence]:
    rng = random.Random(seed)
    return [
        LayerEvidence(
            layer=f"blocks.{i}.conv",
            kl_mean=rng.uniform(0.0, 0.006),
            disagreement=rng.choice([0.0, 0.0, 0.002, 0.004, 0.008]),
            saved_ms=rng.uniform(-0.01, 0.05),
        )
        for i in range(n)
    ]


def _totals(evidence, choices):
    chosen = [e for e, c in zip(evidence, choices, strict=True) if c.chosen]
    return (
        sum(e.kl_mean for e in chosen),
        sum(e.disagreement for e in chosen),
        sum(e.saved_ms for e in chosen),
    )


def test_budget_comes_from_the_policy():
    budget = budget_from_policy(POLICY, "builtin:default", margin=0.5)
    assert budget.kl_budget == pytest.approx(0.01)
    assert budget.disagreement_budget == pytest.approx(0.015)
    assert budget.max_kl_mean == 0.02 and budget.min_agreement == 0.97
    with pytest.raises(UserError, match="margin"):
        budget_from_policy(POLICY, "x", margin=0.0)


@pytest.mark.parametrize("n", [6, EXACT_MAX, 40])
@pytest.mark.parametrize("seed", range(5))
def test_choice_respects_the_budget(n, seed):
    evidence = _random_evidence(n, seed)
    budget = budget_from_policy(POLICY, "p", margin=0.5)
    choices, method = select_layers(evidence, budget)
    assert [c.layer for c in choices] == [e.layer for e in evidence]
    kl, dis, saved = _totals(evidence, choices)
    assert kl <= budget.kl_budget * (1 + 1e-9)
    assert dis <= budget.disagreement_budget * (1 + 1e-9)
    for e, c in zip(evidence, choices, strict=True):
        if e.saved_ms <= 0:
            assert not c.chosen and "does not save time" in c.reason
    assert ("exhaustive" in method) == (sum(e.saved_ms > 0 for e in evidence) <= EXACT_MAX)
    # never worse than the best single eligible layer
    singles = [
        e.saved_ms
        for e in evidence
        if e.saved_ms > 0 and e.kl_mean <= budget.kl_budget
        and e.disagreement <= budget.disagreement_budget
    ]  # fmt: skip
    assert saved >= max(singles, default=0.0) - 1e-12


@pytest.mark.parametrize("seed", range(8))
def test_small_inputs_are_solved_exactly(seed):
    evidence = _random_evidence(9, seed)
    budget = budget_from_policy(POLICY, "p", margin=0.5)
    choices, _ = select_layers(evidence, budget)
    best = 0.0
    for r in range(len(evidence) + 1):
        for combo in itertools.combinations(evidence, r):
            if (
                sum(e.kl_mean for e in combo) <= budget.kl_budget
                and sum(e.disagreement for e in combo) <= budget.disagreement_budget
            ):
                best = max(best, sum(e.saved_ms for e in combo))
    assert _totals(evidence, choices)[2] == pytest.approx(best)


def test_a_tight_budget_drops_the_sensitive_layer():
    evidence = [
        LayerEvidence("fast_but_fragile", kl_mean=0.009, disagreement=0.0, saved_ms=0.10),
        LayerEvidence("a", kl_mean=0.004, disagreement=0.0, saved_ms=0.04),
        LayerEvidence("b", kl_mean=0.004, disagreement=0.0, saved_ms=0.04),
        LayerEvidence("flips", kl_mean=0.0001, disagreement=0.02, saved_ms=0.5),
        LayerEvidence("slower", kl_mean=0.0, disagreement=0.0, saved_ms=-0.01),
    ]
    budget = budget_from_policy(POLICY, "p", margin=0.5)  # KL 0.01, disagreement 0.015
    choices, _ = select_layers(evidence, budget)
    chosen = {c.layer for c in choices if c.chosen}
    assert chosen == {"fast_but_fragile"}  # 0.10 ms > a + b = 0.08 ms, and fits alone
    reasons = {c.layer: c.reason for c in choices}
    assert "alone over the budget" in reasons["flips"]
    assert "does not save time" in reasons["slower"]
    assert "does not fit" in reasons["a"]

    loose = budget_from_policy(POLICY, "p", margin=1.0)  # KL 0.02, disagreement 0.03: all fit
    choices, _ = select_layers(evidence, loose)
    assert {c.layer for c in choices if c.chosen} == {"fast_but_fragile", "a", "b", "flips"}


def test_nothing_pays():
    evidence = [LayerEvidence("x", 0.0, 0.0, -0.1), LayerEvidence("y", float("nan"), 0.0, 1.0)]
    choices, _ = select_layers(evidence, budget_from_policy(POLICY, "p"))
    assert not any(c.chosen for c in choices)
    assert "non-finite" in choices[1].reason


def test_prediction_sums_layers():
    evidence = [LayerEvidence("a", 0.001, 0.002, 0.1), LayerEvidence("b", 0.003, 0.0, 0.3)]
    p = predict(evidence, ["a", "b"], batch=32, fp16_ms=2.0)
    assert p.saved_ms == pytest.approx(0.4)
    assert p.kl_mean == pytest.approx(0.004)
    assert p.agreement == pytest.approx(0.998)
    assert p.fp8_ms == pytest.approx(1.6)
    assert p.speedup == pytest.approx(2.0 / 1.6)
    assert predict(evidence, ["a"], batch=32).speedup is None
    assert predict(evidence, ["a", "b"], batch=32, fp16_ms=0.3).speedup is None
