"""The search's option step: which FP8 quality options the searched recipe keeps, and what each
bought.

From the recipe's own options, each option is tried in a fixed order, on top of those already
kept: compensating weight rounding (`quant/fitting/rounding.py`), its scale candidates and
refinement sweeps (when compensating rounding is kept), per-layer calibrators chosen by their
readers' output error (`quant/calibration/choice.py`), scale migration (`quant/fitting/migrate.py`),
headroom above the calibrated amax (the recipe schema's `activations.headroom`), and last
the propagated fit of weights and biases to the partly quantized network
(`quant/fitting/propagated.py`, with bias correction, which it needs to fit the biases). Each try
rebuilds the plan from the calibration images and scores the fp32 emulation of every candidate
layer against fp32 on the sensitivity subset of the held-out images; an option is kept when the
paired change in KL mean against the options kept so far (the same images, 95% bootstrap
interval, `quality.paired.paired_mean_change`) lies below zero. A decrease within the pairing's
noise keeps the simpler recipe: an option can lower KL by less than the pairing resolves
while costing speed (smooth migration's run-time divisors cost the FP8 engine its hand-offs;
docs/fp8-options.md), and a rule of "any decrease" takes such an option on noise. Options the
recipe already has are not tried again.
The share of each kept option is its KL decrease over the total decrease (the steps are
sequential, so a share is "what this option added given those before it", not its effect
alone). Cost: one calibration (two with migration, five with the calibrator choice, about one
per selected layer for the propagated fit) and one emulation run per option. The propagated
fit is tried last because it fits to whatever rounding, calibrators and migration are kept
before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from quantstudy.engines.builders import build_fakequant, build_fp32
from quantstudy.engines.run import run_engine
from quantstudy.quality.image_scores import kl_per_image
from quantstudy.quality.paired import PAIRED_RESAMPLES, paired_mean_change
from quantstudy.quant.calibration.calibrate import HEADROOM_TRIED
from quantstudy.quant.calibration.choice import choose_calibrators
from quantstudy.quant.fitting.rounding import SEARCHED
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.schema import Recipe
from quantstudy.record import OptionStep
from quantstudy.record.quant_options import QuantOptions

# option -> the change it makes to QuantOptions ("choose": resolved by choose_calibrators)
TRIED: dict[str, dict[str, Any]] = {
    "rounding: compensating": {"rounding": "compensating"},
    "scale candidates and refinement": {
        "scale_candidates": SEARCHED.scales,
        "refine_sweeps": SEARCHED.sweeps,
    },
    "layer_calibrators: chosen": {"layer_calibrators": "choose"},
    "migration: smooth": {"migration": "smooth"},
    f"headroom: {HEADROOM_TRIED:g}": {"headroom": HEADROOM_TRIED},
    "propagated fit": {"propagated": True, "bias_correction": True},
}


def _already(options: QuantOptions, change: dict[str, Any]) -> bool:
    """Whether `options` already hold `change` (or cannot take it: the rounding searches refine
    compensating rounding only)."""
    if change.get("layer_calibrators") == "choose":
        return bool(options.layer_calibrators)
    if "scale_candidates" in change and options.rounding != "compensating":
        return True
    return all(getattr(options, k) == v for k, v in change.items())


def explore_options(
    model: nn.Module,
    example: torch.Tensor,
    layers: list[str],
    batches: Callable[[], Iterable[torch.Tensor]],
    images: torch.Tensor,
    base: QuantOptions,
    *,
    batch: int,
    device: str,
) -> tuple[QuantOptions, QuantPlan, list[OptionStep]]:
    """The kept options, their plan, and one step per option tried (the first step is the
    recipe's own options)."""
    dev = torch.device(device)
    ref = run_engine(build_fp32(model, dev), images, batch)

    def score(options: QuantOptions) -> tuple[QuantPlan, np.ndarray, float]:
        plan = build_plan(model.to(dev), layers, batches, example, options)
        model.cpu()
        out = run_engine(build_fakequant(model, dev, example, plan), images, batch)
        agreement = float((out.argmax(1) == ref.argmax(1)).float().mean())
        return plan, kl_per_image(ref, out), agreement

    plan, per_image, agreement = score(base)
    kl = float(per_image.mean())
    steps = [OptionStep(option="recipe's own options", kl_mean=kl, agreement=agreement, kept=True)]
    options, start = base, kl
    for name, change in TRIED.items():
        if _already(options, change):
            continue
        change = dict(change)
        if change.get("layer_calibrators") == "choose":
            change["layer_calibrators"] = choose_calibrators(
                model.to(dev), layers, batches, options.calibrator
            )
            model.cpu()
        trial = replace(options, **change)
        trial_plan, trial_per_image, trial_agreement = score(trial)
        trial_kl = float(trial_per_image.mean())
        delta = paired_mean_change(per_image, trial_per_image, resamples=PAIRED_RESAMPLES, seed=0)
        kept = delta.high < 0
        steps.append(
            OptionStep(
                option=name,
                kl_mean=trial_kl,
                agreement=trial_agreement,
                kept=kept,
                kl_change=delta.change,
                kl_change_low=delta.low,
                kl_change_high=delta.high,
            )
        )
        if kept:
            options, plan, kl, per_image = trial, trial_plan, trial_kl, trial_per_image
    total = start - kl
    shared = []
    previous = start
    for step in steps[1:]:
        share = None
        if step.kept and total > 0:
            share = (previous - step.kl_mean) / total
            previous = step.kl_mean
        shared.append(step.model_copy(update={"share": share}))
    return options, plan, [steps[0], *shared]


def for_layers(recipe: Recipe, layers: list[str]) -> Recipe:
    """The recipe with its per-layer calibrators limited to `layers` (the searched subset)."""
    kept = {k: v for k, v in recipe.activations.layer_calibrators.items() if k in layers}
    activations = recipe.activations.model_copy(update={"layer_calibrators": kept})
    return recipe.model_copy(update={"activations": activations})


def option_lines(steps: list[OptionStep]) -> list[str]:
    """The option step for the terminal: KL mean and agreement after each option tried."""
    head = f"{'FP8 quality option':34} {'KL mean':>10} {'change [95% CI]':>30} {'agreement':>9}"
    lines = [f"{head} {'kept':>5} {'share':>6}"]
    for st in steps:
        share = "-" if st.share is None else f"{100 * st.share:.0f}%"
        change = "-"
        if st.kl_change is not None:
            change = f"{st.kl_change:+.2g} [{st.kl_change_low:+.2g}, {st.kl_change_high:+.2g}]"
        lines.append(
            f"{st.option:34} {st.kl_mean:>10.4g} {change:>30} {100 * st.agreement:>8.2f}% "
            f"{'yes' if st.kept else 'no':>5} {share:>6}"
        )
    return lines
