"""Is the held-out sample adequate for what the report claims from it?

Two warnings the seed reviews asked for: a class-imbalanced sample weights some classes more than
others, so its accuracy is not an ImageNet-wide estimate; and a sample too small for the claimed
precision, where the top-1 change lies inside its own confidence interval.
"""

from __future__ import annotations

import torch

from quantstudy.record import EngineQuality

IMBALANCE_RATIO = 2.0  # largest class over smallest class above this: imbalanced
SMALL_SAMPLE = 1000  # fewer held-out images than this: the top-1 interval is wide


def sample_balance(
    labels: torch.Tensor | None,
) -> tuple[int | None, int | None, int | None, list[str]]:
    """Classes present and images per class (min, max) of a labelled sample, with warnings.

    Returns (None, None, None, []) for an unlabelled sample: there is no class balance to judge.
    """
    if labels is None:
        return None, None, None, []
    if labels.numel() == 0:
        raise ValueError("sample_balance needs at least one label")
    counts = torch.bincount(labels.flatten().long())
    counts = counts[counts > 0]
    n_classes, low, high = int(counts.numel()), int(counts.min()), int(counts.max())
    warnings = []
    if high > IMBALANCE_RATIO * low:
        warnings.append(
            f"held-out sample is class-imbalanced: {n_classes} classes with {low} to {high} "
            f"images each (largest over {IMBALANCE_RATIO:g}x the smallest); accuracy weights "
            "classes unequally and is not an estimate over a balanced set"
        )
    return n_classes, low, high, warnings


def precision_warnings(q: EngineQuality) -> list[str]:
    """Warnings when the sample cannot support the precision of the top-1 change it reports.

    Only labelled engines have a top-1 change and an interval; unlabelled ones get none.
    """
    if q.top1_change is None or q.ci_low is None or q.ci_high is None:
        return []
    change, low, high = q.top1_change, q.ci_low, q.ci_high
    half_width = (high - low) / 2.0
    interval = f"95% CI {_points(low)} to {_points(high)} points"
    warnings = []
    if half_width > abs(change):
        warnings.append(
            f"{q.engine}: top-1 change {_points(change)} points is within noise: {interval}, "
            f"half-width {half_width * 100:.2f} > |change| {abs(change) * 100:.2f} points "
            f"on {q.n_images} images"
        )
    if q.n_images < SMALL_SAMPLE:
        warnings.append(
            f"{q.engine}: only {q.n_images} held-out images (< {SMALL_SAMPLE}): the top-1 "
            f"interval is wide ({interval})"
        )
    return warnings


def _points(fraction: float) -> str:
    """A fraction as signed percentage points with two decimals, e.g. 0.0013 -> '+0.13'."""
    return f"{fraction * 100:+.2f}"
