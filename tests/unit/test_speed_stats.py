"""Timing statistics: quartiles, the per-round-pair ratio, and when the warnings fire."""

import pytest

from quantstudy.engines.interleaved import timing_stats
from quantstudy.speed.stats import (
    MAX_RELATIVE_SPREAD,
    MIN_ROUNDS,
    paired_ratios,
    summarize_batch,
)


def test_timing_stats_quartiles_by_hand():
    s = timing_stats([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)


def test_timing_stats_interpolates_between_values():
    # numpy's default linear percentiles on [1, 2, 3, 4]: positions 0.75, 1.5, 2.25.
    s = timing_stats([4.0, 2.0, 1.0, 3.0])
    assert s.q1 == pytest.approx(1.75)
    assert s.median == pytest.approx(2.5)
    assert s.q3 == pytest.approx(3.25)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, float("inf")]])
def test_timing_stats_rejects_empty_and_nonfinite(bad):
    with pytest.raises(ValueError):
        timing_stats(bad)


def test_ratio_is_per_round_pair_not_ratio_of_medians():
    fp16 = [1.0, 3.0, 2.0]
    fp8 = [2.0, 1.0, 3.0]
    speed = summarize_batch(1, fp16, fp8)
    # Both medians are 2.0, so a ratio of medians would say 1.0.
    assert speed.fp16_ms.median == speed.fp8_ms.median == 2.0
    # Per pair: 0.5, 3.0, 2/3 -> sorted 0.5, 0.667, 3.0.
    assert speed.ratio.median == pytest.approx(2.0 / 3.0)
    assert speed.ratio.q1 == pytest.approx(0.5 + 0.5 * (2.0 / 3.0 - 0.5))
    assert speed.ratio.q3 == pytest.approx(2.0 / 3.0 + 0.5 * (3.0 - 2.0 / 3.0))
    assert (speed.ratio.min, speed.ratio.max) == (0.5, 3.0)
    assert speed.ratio.n == 3


def test_ratio_is_fp16_over_fp8():
    assert paired_ratios([2.0, 3.0], [1.0, 1.5]) == [2.0, 2.0]


def test_ratio_needs_equal_rounds_and_positive_times():
    with pytest.raises(ValueError):
        paired_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_ratios([1.0, 0.0], [1.0, 1.0])


def test_clean_timings_give_no_warning():
    n = MIN_ROUNDS + 2
    fp16 = [2.00 + 0.001 * (i % 3) for i in range(n)]
    fp8 = [1.00 + 0.001 * (i % 2) for i in range(n)]
    speed = summarize_batch(32, fp16, fp8)
    assert speed.warnings == []
    assert speed.ratio.median == pytest.approx(2.0, rel=0.01)


def test_few_rounds_warn():
    speed = summarize_batch(1, [2.0] * 5, [1.0] * 5)
    assert len(speed.warnings) == 1
    assert "only 5 rounds" in speed.warnings[0]
    assert not speed.warnings[0].startswith("batch")  # the report prefixes the batch itself


def test_noisy_engine_warns_and_names_it():
    n = 12
    fp16 = [1.0, 1.2] * (n // 2)  # IQR 0.2 over median 1.1: 18%
    fp8 = [0.5] * n
    speed = summarize_batch(128, fp16, fp8)
    assert len(speed.warnings) == 1
    assert "fp16 timings are noisy" in speed.warnings[0]
    assert "18.2%" in speed.warnings[0]


def test_spread_at_the_threshold_does_not_warn():
    # Sorted 1.0 x6, 1.05 x6: q1 1.0, q3 1.05, median 1.025 -> 4.9% (below 5%).
    fp8 = [1.0, 1.05] * 6
    speed = summarize_batch(1, [3.0] * 12, fp8)
    spread = (speed.fp8_ms.q3 - speed.fp8_ms.q1) / speed.fp8_ms.median
    assert spread < MAX_RELATIVE_SPREAD
    assert speed.warnings == []


def test_ratio_iqr_straddling_one_warns():
    n = 12
    fp16 = [1.0] * n
    fp8 = [0.98, 1.02] * (n // 2)  # 4% spread: not noisy, but the ratio's IQR contains 1.0
    speed = summarize_batch(1, fp16, fp8)
    assert len(speed.warnings) == 1
    assert "contains 1.0" in speed.warnings[0]
    assert "sign of the gain" in speed.warnings[0]


def test_clear_slowdown_does_not_warn_about_sign():
    speed = summarize_batch(1, [1.0] * 12, [1.1] * 12)
    assert speed.ratio.q3 < 1.0
    assert speed.warnings == []
