"""The decision's intervals and images-needed figures, checked against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantstudy.decision import stats


def _settles_change(n: int, pg: float, pl: float, threshold: float, reps: int, seed: int) -> float:
    """Share of simulated studies of `n` images whose top-1 interval clears `threshold`."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [pg, pl, 1.0 - pg - pl], size=reps)
    settled = 0
    for g, lost, _ in counts:
        low, high = stats.paired_change_interval(int(g), int(lost), n, 0.95)
        settled += low >= threshold or high < threshold
    return settled / reps


def _settles_agreement(n: int, p: float, threshold: float, reps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    settled = 0
    for k in rng.binomial(n, p, size=reps):
        low, high = stats.proportion_interval(int(k), n, 0.95)
        settled += low >= threshold or high < threshold
    return settled / reps


def _simulated_n(settles, lo: int, hi: int, reps: int = 300) -> int:
    """Smallest n (to 3%) at which `settles(n)` reaches the figure's power, by bisection."""
    while hi / lo > 1.03:
        mid = int(math.sqrt(lo * hi))
        if settles(mid, reps) >= stats.POWER:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize(
    ("pg", "pl", "threshold"),
    [
        (0.005, 0.005, -0.005),  # no net change, 1% of images change correctness
        (0.004, 0.006, -0.005),  # a real 0.2-point loss, margin 0.5 points
        (0.004, 0.014, -0.005),  # a real 1-point loss: would settle as a fail
    ],
)
def test_top1_images_needed_matches_a_simulation(pg, pl, threshold):
    n_obs = 1000  # the observed rates, as if counted on 1000 images
    formula = stats.images_for_change(round(pg * n_obs), round(pl * n_obs), n_obs, threshold, 0.95)
    sim = _simulated_n(
        lambda n, reps: _settles_change(n, pg, pl, threshold, reps, seed=n),
        formula // 8,
        formula * 8,
    )
    assert abs(formula - sim) / sim < 0.2, (formula, sim)


@pytest.mark.parametrize(("p", "threshold"), [(0.975, 0.97), (0.96, 0.97)])
def test_agreement_images_needed_matches_a_simulation(p, threshold):
    formula = stats.images_for_proportion(round(p * 1000), 1000, threshold, 0.95)
    sim = _simulated_n(
        lambda n, reps: _settles_agreement(n, p, threshold, reps, seed=n),
        formula // 8,
        formula * 8,
    )
    assert abs(formula - sim) / sim < 0.2, (formula, sim)


def test_paired_interval_without_changes_keeps_a_width():
    low, high = stats.paired_change_interval(0, 0, 1300, 0.95)
    z2 = stats.z_of(0.95) ** 2
    assert low == pytest.approx(-z2 / (1300 + z2), rel=1e-6)
    assert high == pytest.approx(z2 / (1300 + z2), rel=1e-6)


def test_paired_interval_covers_the_truth():
    rng = np.random.default_rng(1)
    n, pg, pl = 600, 0.01, 0.02
    covered = 0
    for g, lost, _ in rng.multinomial(n, [pg, pl, 1 - pg - pl], size=400):
        low, high = stats.paired_change_interval(int(g), int(lost), n, 0.95)
        covered += low <= pg - pl <= high
    assert 0.92 <= covered / 400 <= 0.98


def test_paired_interval_narrows_with_confidence():
    wide = stats.paired_change_interval(10, 20, 1300, 0.99)
    narrow = stats.paired_change_interval(10, 20, 1300, 0.9)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]


def test_estimate_on_the_threshold_has_no_figure():
    assert stats.images_for_change(5, 12, 1400, -0.005, 0.95) is None
    assert stats.images_for_proportion(97, 100, 0.97, 0.95) is None


def test_about_rounds_up_to_two_significant_figures():
    assert [stats.about(x) for x in (None, 94, 125, 3140, 3100, 93955)] == [
        None,
        94,
        130,
        3200,
        3100,
        94000,
    ]
