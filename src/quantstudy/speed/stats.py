"""Timing statistics in pyperf's spirit: median and spread over rounds, and plain warnings.

Pure functions over lists of per-round times (milliseconds per engine call), no GPU; the
median and quartiles of one list are `engines/interleaved.py: timing_stats`, beside the rounds.

The speed ratio is x = fp16 time / FP8 time, so x > 1 means FP8 is faster. It is computed per
round pair (round i of fp16 against round i of FP8, which the harness runs back to back) and then
summarised, not as a ratio of the two medians: pairing cancels slow drifts (clocks, temperature,
other tenants) that move both engines together, and the spread of the paired ratios is the spread
that matters for the claim "FP8 is faster".
"""

from __future__ import annotations

from collections.abc import Sequence

from quantstudy.engines.interleaved import timing_stats
from quantstudy.record import BatchSpeed, TimingStats
from quantstudy.record.vocab import Engine

MIN_ROUNDS = 10
"""Fewer rounds than this get a warning: quartiles of a handful of values are not a spread."""

MAX_RELATIVE_SPREAD = 0.05
"""An engine whose IQR / median exceeds this (5%) gets a warning: the timings are noisy."""


def relative_spread(stats: TimingStats) -> float:
    """IQR / median: the spread of a timing as a fraction of its typical value."""
    return (stats.q3 - stats.q1) / stats.median


def sign_unsupported(q1: float, q3: float) -> bool:
    """The interval [q1, q3] of the per-round ratio x contains 1.0: the rounds do not say
    whether FP8 is faster or slower (the study's warning, and every table's "not settled")."""
    return q1 <= 1.0 <= q3


def paired_ratios(fp16_ms: Sequence[float], fp8_ms: Sequence[float]) -> list[float]:
    """x_i = fp16_ms[i] / fp8_ms[i] for each round pair i."""
    if len(fp16_ms) != len(fp8_ms):
        raise ValueError(
            f"ratio needs one fp8 round per fp16 round, got {len(fp16_ms)} and {len(fp8_ms)}"
        )
    if any(t <= 0 for t in fp16_ms) or any(t <= 0 for t in fp8_ms):
        raise ValueError("timings must be positive to form a ratio")
    return [a / b for a, b in zip(fp16_ms, fp8_ms, strict=True)]


def speed_warnings(fp16: TimingStats, fp8: TimingStats, ratio: TimingStats) -> list[str]:
    """The pyperf-style warnings for one batch size; empty when the evidence is clean.

    The batch size is not repeated in the text: a warning belongs to its `BatchSpeed`.
    """
    warnings: list[str] = []
    if ratio.n < MIN_ROUNDS:
        warnings.append(
            f"only {ratio.n} rounds (fewer than {MIN_ROUNDS}); "
            "the quartiles are not a reliable spread"
        )
    for name, stats in ((Engine.FP16, fp16), (Engine.FP8, fp8)):
        spread = relative_spread(stats)
        if spread > MAX_RELATIVE_SPREAD:
            warnings.append(
                f"{name} timings are noisy: IQR/median {spread:.1%} "
                f"exceeds {MAX_RELATIVE_SPREAD:.0%} (median {stats.median:.4f} ms, "
                f"IQR {stats.q1:.4f} to {stats.q3:.4f} ms)"
            )
    if sign_unsupported(ratio.q1, ratio.q3):
        warnings.append(
            "the IQR of the per-round ratio x = fp16/fp8 "
            f"({ratio.q1:.3f} to {ratio.q3:.3f}) contains 1.0; these rounds do not support "
            "the sign of the gain"
        )
    return warnings


def summarize_batch(batch: int, fp16_ms: Sequence[float], fp8_ms: Sequence[float]) -> BatchSpeed:
    """Per-engine stats, the per-round-pair ratio x = fp16/fp8, and warnings, for one batch."""
    fp16 = timing_stats(fp16_ms)
    fp8 = timing_stats(fp8_ms)
    ratio = timing_stats(paired_ratios(fp16_ms, fp8_ms))
    return BatchSpeed(
        batch=batch,
        fp16_ms=fp16,
        fp8_ms=fp8,
        ratio=ratio,
        warnings=speed_warnings(fp16, fp8, ratio),
    )
