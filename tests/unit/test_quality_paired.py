"""Paired statistics: the 43-differ / net +2 case from the seed review, McNemar, bootstrap."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from quantstudy.quality import paired
from quantstudy.quality.balance import precision_warnings
from quantstudy.quality.metrics import score_engine
from quantstudy.quality.paired import (
    MeanBootstrap,
    bootstrap_mean_intervals,
    bootstrap_means,
    mcnemar_exact,
    paired_bootstrap,
    paired_counts,
    paired_mean_change,
)
from quantstudy.record.errors import UserError

torch.set_num_threads(1)

N_IMAGES, N_CLASSES, REF_RIGHT = 1500, 10, 1200


def seed_review_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1500 images, reference right on 1200; the engine differs on 43: 22 gained, 20 lost, 1 w2w."""
    labels = torch.arange(N_IMAGES) % N_CLASSES
    ref_pred = labels.clone()
    ref_pred[REF_RIGHT:] = (labels[REF_RIGHT:] + 1) % N_CLASSES
    eng_pred = ref_pred.clone()
    gained = torch.arange(REF_RIGHT, REF_RIGHT + 22)  # reference wrong -> engine right
    eng_pred[gained] = labels[gained]
    lost = torch.arange(0, 20)  # reference right -> engine wrong
    eng_pred[lost] = (labels[lost] + 3) % N_CLASSES
    eng_pred[1400] = (labels[1400] + 2) % N_CLASSES  # wrong -> another wrong class
    return _logits(ref_pred, seed=1), _logits(eng_pred, seed=2), labels


def _logits(pred: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = 0.1 * torch.randn(len(pred), N_CLASSES, generator=g)
    return noise + 5.0 * torch.nn.functional.one_hot(pred, N_CLASSES).float()


def test_counts_separate_net_change_from_differing_predictions():
    ref, eng, labels = seed_review_case()
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000)
    assert q.differ_count == 43
    assert q.agreement == pytest.approx((N_IMAGES - 43) / N_IMAGES)
    assert (q.gained, q.lost, q.wrong_to_wrong, q.net_change) == (22, 20, 1, 2)
    assert q.top1_reference == pytest.approx(REF_RIGHT / N_IMAGES)
    assert q.top1 == pytest.approx((REF_RIGHT + 2) / N_IMAGES)
    assert q.top1_change == pytest.approx(2 / N_IMAGES)


def test_mcnemar_matches_scipy_and_exact_binomial_tail():
    ref, eng, labels = seed_review_case()
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000)
    assert q.mcnemar_p == pytest.approx(binomtest(22, 42, 0.5).pvalue, rel=1e-12)
    # Independent: two-sided exact tail, 2 * P(X <= 20) for X ~ Binomial(42, 1/2).
    tail = sum(math.comb(42, k) for k in range(21)) / 2**42
    assert q.mcnemar_p == pytest.approx(2 * tail, rel=1e-12)
    assert 0.8 < q.mcnemar_p < 0.9  # 22 vs 20 is no evidence of a change


def test_mcnemar_edge_cases():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 2**10)


def test_bootstrap_reproducible_under_seed_and_changes_with_seed():
    ref, eng, labels = seed_review_case()
    a = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000, seed=7)
    b = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000, seed=7)
    c = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000, seed=8)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    assert (a.bootstrap_resamples, a.bootstrap_seed) == (1000, 7)
    assert a.ci_low <= a.top1_change <= a.ci_high


def test_bootstrap_is_paired():
    """The interval width matches the paired normal approximation, not the unpaired one."""
    ref, eng, labels = seed_review_case()
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=4000)
    delta = np.zeros(N_IMAGES)
    delta[:22], delta[22:42] = 1.0, -1.0
    paired_half = 1.96 * delta.std() / math.sqrt(N_IMAGES)  # about 0.0085
    p_ref = REF_RIGHT / N_IMAGES
    unpaired_half = 1.96 * math.sqrt(2 * p_ref * (1 - p_ref) / N_IMAGES)  # about 0.029
    half = (q.ci_high - q.ci_low) / 2
    assert half == pytest.approx(paired_half, rel=0.15)
    assert half < unpaired_half / 2


def test_bootstrap_degenerate_when_nothing_changes():
    correct = np.array([True, False, True, True])
    ci = paired_bootstrap(correct, correct, resamples=1000, seed=0)
    assert (ci.change, ci.low, ci.high) == (0.0, 0.0, 0.0)


def test_bootstrap_rejects_too_few_resamples():
    correct = np.array([True, False])
    with pytest.raises(UserError, match="at least 1000"):
        paired_bootstrap(correct, correct, resamples=100, seed=0)


def test_paired_counts_add_up_to_differing():
    ref_correct = np.array([True, True, False, False, False, True])
    eng_correct = np.array([True, False, True, False, False, True])
    agree = np.array([True, False, False, False, True, True])
    counts = paired_counts(ref_correct, eng_correct, agree)
    assert (counts.gained, counts.lost, counts.wrong_to_wrong) == (1, 1, 1)
    assert counts.gained + counts.lost + counts.wrong_to_wrong == int((~agree).sum())


def test_seed_review_case_is_flagged_as_within_noise():
    """Net +2 of 1500 with 42 discordant pairs: the precision warning must say it is noise."""
    ref, eng, labels = seed_review_case()
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000)
    assert q.ci_low < 0 < q.ci_high
    warnings = precision_warnings(q)
    assert len(warnings) == 1
    assert warnings[0].startswith("fp8: top-1 change +0.13 points is within noise")


def test_paired_mean_change_is_tighter_than_either_mean():
    """Two recipes' per-image KL share most of their variation (the same hard images), so the
    paired interval on their difference is far narrower than either mean's own spread."""
    rng = np.random.default_rng(3)
    hard = rng.exponential(0.01, 1300)
    base = hard * (1 + 0.05 * rng.standard_normal(1300))
    other = 0.9 * hard * (1 + 0.05 * rng.standard_normal(1300))
    ci = paired_mean_change(base, other, resamples=2000, seed=0)
    assert ci.change == pytest.approx(float((other - base).mean()))
    assert ci.low < ci.change < ci.high < 0  # a real 10% drop, resolved
    ((_, low, high),) = bootstrap_mean_intervals(base, (0.95,), resamples=2000, seed=0)
    assert (ci.high - ci.low) < 0.5 * (high - low)


def test_paired_mean_change_of_flags_counts_images():
    base = np.zeros(100)
    base[:10] = 1
    other = np.zeros(100)
    other[5:20] = 1  # 15 differ: 5 left, 10 joined
    ci = paired_mean_change(base, other, resamples=1000, seed=0)
    assert ci.change * 100 == pytest.approx(5)
    assert ci.low < ci.change < ci.high
    with pytest.raises(ValueError, match="differ in length"):
        paired_mean_change(base, other[:50], resamples=1000, seed=0)


def _alone(values: np.ndarray, levels: tuple[float, ...], resamples: int, seed: int) -> list:
    """One bootstrap as the record's intervals were first drawn, on its own: a chunk of
    index draws, its means, the next chunk (the reference `bootstrap_means` must equal)."""
    n = values.size
    rng = np.random.default_rng(seed)
    per_chunk = max(1, paired._CHUNK_DRAWS // n)
    means = np.empty(resamples)
    for start in range(0, resamples, per_chunk):
        stop = min(start + per_chunk, resamples)
        means[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tails = [((1.0 - lv) / 2.0 * 100.0, lv) for lv in levels]
    return [(lv, *(float(x) for x in np.percentile(means, [t, 100 - t]))) for t, lv in tails]


@pytest.mark.parametrize("workers", [1, 3])
def test_shared_draws_give_each_interval_as_drawn_alone(monkeypatch, workers):
    """Jobs over as many images share their index draws (a shorter job reads a prefix, over a
    chunk boundary too); jobs over other counts draw their own; the values are bit for bit
    those of each job alone, on any number of threads."""
    # 20 resamples a chunk at 300 images, gathered 8 at a time: chunks and blocks end short
    monkeypatch.setattr(paired, "_CHUNK_DRAWS", 6000)
    monkeypatch.setattr(paired, "_BLOCK_DRAWS", 2400)
    rng = np.random.default_rng(5)
    jobs = [
        MeanBootstrap(rng.exponential(0.01, 300), (0.8, 0.95, 0.999), 2000),
        MeanBootstrap(rng.integers(-1, 2, 300), (0.95,), 1013),
        MeanBootstrap(rng.exponential(0.01, 297), (0.95,), 1000),
        MeanBootstrap(rng.exponential(0.01, 300), (0.9,), 1001),
        MeanBootstrap(np.zeros(0), (0.95,), 1000),
    ]
    got = bootstrap_means(jobs, seed=7, workers=workers)
    want = [
        _alone(np.asarray(j.values, dtype=np.float64), j.levels, j.resamples, 7)
        if j.values.size
        else []
        for j in jobs
    ]
    assert got == want  # floats compared exactly
