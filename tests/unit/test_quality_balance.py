"""Sample adequacy warnings: class imbalance and a sample too small for its claimed precision."""

import torch

from quantstudy.quality.balance import precision_warnings, sample_balance
from quantstudy.record import EngineQuality

torch.set_num_threads(1)


def test_balanced_sample_has_no_warning():
    labels = torch.tensor([3, 7, 9] * 4)
    assert sample_balance(labels) == (3, 4, 4, [])


def test_imbalanced_sample_warns_with_numbers():
    labels = torch.tensor([0] * 2 + [5] * 2 + [8])  # like two per class for some, one for others
    n, low, high, warnings = sample_balance(labels)
    assert (n, low, high) == (3, 1, 2)
    assert warnings == []  # exactly twice is not over twice
    n, low, high, warnings = sample_balance(torch.tensor([0] * 5 + [1] * 2))
    assert (n, low, high) == (2, 2, 5)
    assert len(warnings) == 1 and "2 to 5 images" in warnings[0]


def test_unlabelled_sample():
    assert sample_balance(None) == (None, None, None, [])


def quality(n: int, change: float, low: float, high: float) -> EngineQuality:
    return EngineQuality(
        engine="fp8", n_images=n, labelled=True, top1=0.8, top5=0.95, top1_reference=0.8,
        agreement=0.97, differ_count=43, top1_change=change, ci_low=low, ci_high=high,
        kl_mean=0.01, kl_median=0.005, kl_p99=0.1, kl_max=0.5, max_abs_logit_diff=1.0,
        kl_histogram=[], kl_bin_edges=[],
    )  # fmt: skip


def test_precision_warning_when_ci_straddles_change():
    warnings = precision_warnings(quality(1500, 0.0013, -0.0073, 0.0100))
    assert len(warnings) == 1
    assert warnings[0].startswith("fp8: top-1 change +0.13 points is within noise")
    assert "-0.73 to +1.00" in warnings[0] and "1500 images" in warnings[0]


def test_no_precision_warning_when_change_is_resolved():
    assert precision_warnings(quality(1500, -0.02, -0.028, -0.012)) == []


def test_small_sample_warning():
    warnings = precision_warnings(quality(500, -0.05, -0.07, -0.03))
    assert len(warnings) == 1 and "only 500 held-out images" in warnings[0]
    assert warnings[0].startswith("fp8:")


def test_unlabelled_engine_gets_no_precision_warning():
    q = quality(100, 0.0, 0.0, 0.0).model_copy(
        update={"labelled": False, "top1_change": None, "ci_low": None, "ci_high": None}
    )
    assert precision_warnings(q) == []
