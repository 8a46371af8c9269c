"""The budgeted choice of layers: which subset of candidates maximises the predicted gain.

The model behind the prediction, and what is approximate about it:

- Speed is additive: quantizing a set S saves sum over S of each layer's own saving (fp16 ms -
  FP8 ms of the layer's operation at its real shape and batch, quantize work included). Fusion
  across layer boundaries, shared quantizers and changed memory traffic are not modelled; the
  search reports the same prediction for the whole candidate recipe next to that recipe's
  measured figure, so the size of this error is visible.
- Quality is additive: KL(fp32 || S quantized) is taken as the sum of the per-layer KL means with
  one layer quantized, and the disagreement (1 - top-1 agreement) as the sum of per-layer
  disagreements. Errors of different layers can compound or cancel, so this is a proxy. The
  budget therefore spends only `margin` of the policy's allowance, and the chosen recipe is
  verified by a full study, whose measured figures are the ones that count.

Selection under the two budgets (KL and disagreement): layers that do not save time, have a
non-finite score, or alone exceed a budget are never chosen. Up to `EXACT_MAX` eligible layers,
every subset is tried (exact under the additive model). Beyond that, greedy by saving per unit
of cost (cost = the larger of the layer's shares of the two budgets), then compared with the best
single layer (for one budget this greedy-or-best-single rule is within a factor 2 of the optimum).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from quantstudy.decision.schema import Policy
from quantstudy.record import LayerChoice, SearchBudget, SearchPrediction
from quantstudy.record.errors import UserError

EXACT_MAX = 12
"""Up to this many eligible layers the subset is found exactly (2^12 subsets)."""

DEFAULT_MARGIN = 0.5
"""Share of the policy's quality budget the additive prediction may spend."""


@dataclass(frozen=True)
class LayerEvidence:
    """What the search knows of one candidate layer."""

    layer: str
    kl_mean: float  # only this layer quantized
    disagreement: float  # 1 - top-1 agreement, only this layer quantized
    saved_ms: float  # fp16 ms - FP8 ms of the layer's own operation


def budget_from_policy(policy: Policy, label: str, margin: float = DEFAULT_MARGIN) -> SearchBudget:
    """The quality budget of the search: `margin` of the policy's KL and agreement allowances."""
    if not 0.0 < margin <= 1.0:
        raise UserError(f"--margin must be in (0, 1], got {margin}")
    max_kl, min_agreement = policy.quality.kl_mean.max, policy.quality.agreement.min
    return SearchBudget(
        policy=label,
        max_kl_mean=max_kl,
        min_agreement=min_agreement,
        margin=margin,
        kl_budget=margin * max_kl,
        disagreement_budget=margin * (1.0 - min_agreement),
    )


def _share(value: float, budget: float) -> float:
    if budget > 0:
        return value / budget
    return 0.0 if value <= 0 else math.inf


def _cost(e: LayerEvidence, budget: SearchBudget) -> float:
    return max(
        _share(e.kl_mean, budget.kl_budget), _share(e.disagreement, budget.disagreement_budget)
    )


def _fits(kl: float, dis: float, budget: SearchBudget) -> bool:
    # A relative tolerance of 1e-12 absorbs float summation order, nothing more.
    return kl <= budget.kl_budget * (1 + 1e-12) and dis <= budget.disagreement_budget * (1 + 1e-12)


def _ineligible(e: LayerEvidence, budget: SearchBudget) -> str | None:
    if not all(math.isfinite(v) for v in (e.kl_mean, e.disagreement, e.saved_ms)):
        return "not chosen: a non-finite sensitivity or speed figure"
    if e.saved_ms <= 0:
        return f"not chosen: FP8 does not save time here ({e.saved_ms:+.4f} ms)"
    if not _fits(e.kl_mean, e.disagreement, budget):
        return (
            f"not chosen: alone over the budget (KL {e.kl_mean:.3g} of {budget.kl_budget:.3g}, "
            f"disagreement {e.disagreement:.3g} of {budget.disagreement_budget:.3g})"
        )
    return None


def _exact(pool: list[LayerEvidence], budget: SearchBudget) -> list[LayerEvidence]:
    best: tuple[float, float, int] = (0.0, 0.0, 0)  # (saving, -KL, -count): larger is better
    best_set: tuple[LayerEvidence, ...] = ()
    for r in range(1, len(pool) + 1):
        for combo in itertools.combinations(pool, r):
            kl = sum(e.kl_mean for e in combo)
            if not _fits(kl, sum(e.disagreement for e in combo), budget):
                continue
            key = (sum(e.saved_ms for e in combo), -kl, -r)
            if key > best:
                best, best_set = key, combo
    return list(best_set)


def _greedy(pool: list[LayerEvidence], budget: SearchBudget) -> list[LayerEvidence]:
    def density(e: LayerEvidence) -> float:
        cost = _cost(e, budget)
        return math.inf if cost == 0 else e.saved_ms / cost

    chosen: list[LayerEvidence] = []
    kl = dis = 0.0
    for e in sorted(pool, key=lambda e: (-density(e), -e.saved_ms, e.layer)):
        if _fits(kl + e.kl_mean, dis + e.disagreement, budget):
            chosen.append(e)
            kl += e.kl_mean
            dis += e.disagreement
    single = max(pool, key=lambda e: (e.saved_ms, -e.kl_mean))
    if single.saved_ms > sum(e.saved_ms for e in chosen):
        return [single]
    return chosen


def method_text(n_eligible: int) -> str:
    how = (
        f"exhaustive over the {n_eligible} eligible layers"
        if n_eligible <= EXACT_MAX
        else f"greedy by saving per budget share over {n_eligible} eligible layers, or the best "
        "single layer if it saves more (within 2x of the optimum for one budget)"
    )
    return (
        f"{how}; predicted saving = sum of per-layer savings, predicted KL = sum of per-layer "
        "KL means, predicted disagreement = sum of per-layer disagreements (additive "
        "approximations; the verified study is the measurement)"
    )


def select_layers(
    evidence: list[LayerEvidence], budget: SearchBudget
) -> tuple[list[LayerChoice], str]:
    """Choose layers maximising the summed saving within the budget; one choice per layer, in
    the order of `evidence`, and the method text."""
    if not evidence:
        raise UserError("the search has no candidate layers: the candidate recipe selects none")
    reasons = {e.layer: _ineligible(e, budget) for e in evidence}
    pool = [e for e in evidence if reasons[e.layer] is None]
    if not pool:
        chosen: list[LayerEvidence] = []
    elif len(pool) <= EXACT_MAX:
        chosen = _exact(pool, budget)
    else:
        chosen = _greedy(pool, budget)
    picked = {e.layer for e in chosen}
    choices = []
    for e in evidence:
        if e.layer in picked:
            reason = f"chosen: saves {e.saved_ms:.4f} ms, KL {e.kl_mean:.3g} alone"
        else:
            reason = reasons[e.layer] or "not chosen: does not fit the budget with the others"
        choices.append(
            LayerChoice(
                layer=e.layer,
                chosen=e.layer in picked,
                reason=reason,
                kl_mean=e.kl_mean,
                disagreement=e.disagreement,
                saved_ms=e.saved_ms,
            )
        )
    return choices, method_text(len(pool))


def predict(
    evidence: list[LayerEvidence], layers: list[str], batch: int, fp16_ms: float | None = None
) -> SearchPrediction:
    """The additive prediction for quantizing `layers`; with the whole-model fp16 time, also
    the predicted FP8 time and speed-up."""
    by_name = {e.layer: e for e in evidence}
    missing = [n for n in layers if n not in by_name]
    if missing:
        raise ValueError(f"no evidence for layers {missing[:5]}")
    saved = sum(by_name[n].saved_ms for n in layers)
    fp8_ms = speedup = None
    if fp16_ms is not None:
        fp8_ms = fp16_ms - saved
        # Savings at or above the whole model's time: the additive model broke; no ratio.
        speedup = fp16_ms / fp8_ms if fp8_ms > 0 else None
    return SearchPrediction(
        layers=list(layers),
        batch=batch,
        saved_ms=saved,
        kl_mean=sum(by_name[n].kl_mean for n in layers),
        # Summed disagreements can pass 1 (the proxy double-counts images): clamp at 0.
        agreement=max(0.0, 1.0 - sum(by_name[n].disagreement for n in layers)),
        fp16_ms=fp16_ms,
        fp8_ms=fp8_ms,
        speedup=speedup,
    )
