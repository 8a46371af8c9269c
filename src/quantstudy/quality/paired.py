"""Paired statistics on per-image correctness: who gained, who lost, and is the change real.

The engine and the fp32 reference score the same images, so the comparison is paired: the
per-image counts (gained, lost, wrong-to-wrong) keep the net change in correct predictions apart
from the number of predictions that changed (a seed study reported a net change of 2 as "2 images
change" while 43 predictions differed). McNemar's exact test and a paired bootstrap interval say
whether the net change is distinguishable from noise at this sample size.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

from quantstudy.record.errors import UserError

MIN_RESAMPLES = 1000
# Resamples of a paired change between two recipes on the same images (`paired_mean_change`'s
# callers: the options table and the search's option step), seed 0 as the study's intervals.
PAIRED_RESAMPLES = 2000
CI_LEVEL = 0.95
# Index draws per chunk (resamples x images): bounds memory for large held-out sets.
_CHUNK_DRAWS = 4_000_000
# Index draws gathered at a time for their means (`_fill`): 3.2 MB of values, kept in cache.
_BLOCK_DRAWS = 400_000


@dataclass(frozen=True)
class PairedCounts:
    """Per-image transitions from the reference to the engine, on one labelled set."""

    gained: int  # reference wrong, engine right
    lost: int  # reference right, engine wrong
    wrong_to_wrong: int  # both wrong and the predictions differ

    @property
    def net_change(self) -> int:
        return self.gained - self.lost


@dataclass(frozen=True)
class BootstrapCI:
    """Paired bootstrap percentile interval on the top-1 change (fractions, not points)."""

    change: float
    low: float
    high: float
    resamples: int
    seed: int


@dataclass(frozen=True)
class MeanBootstrap:
    """One mean to bootstrap: per-image values, the interval levels, the resamples."""

    values: np.ndarray
    levels: tuple[float, ...]
    resamples: int


Interval = tuple[float, float, float]  # (level, low, high)


def paired_counts(
    ref_correct: np.ndarray, eng_correct: np.ndarray, agree: np.ndarray
) -> PairedCounts:
    """Count gained, lost and wrong-to-wrong images.

    `agree` marks images where both predictions are valid and equal; every other image is a
    differing prediction, so gained + lost + wrong_to_wrong equals the differing count.
    """
    _same_length(ref_correct, eng_correct, agree)
    ref_correct, eng_correct, agree = (
        np.asarray(a, dtype=bool) for a in (ref_correct, eng_correct, agree)
    )
    both_wrong_differ = ~ref_correct & ~eng_correct & ~agree
    return PairedCounts(
        gained=int(np.sum(~ref_correct & eng_correct)),
        lost=int(np.sum(ref_correct & ~eng_correct)),
        wrong_to_wrong=int(np.sum(both_wrong_differ)),
    )


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs at p = 0.5.

    With no discordant pairs there is no evidence of any change, so p = 1.0.
    """
    discordant = gained + lost
    if discordant == 0:
        return 1.0
    return float(binomtest(gained, discordant, 0.5, alternative="two-sided").pvalue)


def paired_bootstrap(
    ref_correct: np.ndarray, eng_correct: np.ndarray, *, resamples: int, seed: int
) -> BootstrapCI:
    """95% percentile interval on (engine top-1 - reference top-1), resampling images jointly.

    One index draw picks the same images for both engines, which keeps the pairing (the two
    correctness vectors are strongly correlated, and an unpaired bootstrap would overstate the
    noise). The draws come from `numpy.random.default_rng(seed)` in fixed-size chunks, so the
    interval is a pure function of the inputs, `resamples` and `seed`.
    """
    job = paired_change(ref_correct, eng_correct, resamples=resamples)
    ((interval,),) = bootstrap_means([job], seed=seed)
    return paired_ci(job, interval, seed)


def paired_change(
    ref_correct: np.ndarray, eng_correct: np.ndarray, *, resamples: int
) -> MeanBootstrap:
    """The per-image change in correctness (engine - reference) as the 95% bootstrap of
    `paired_bootstrap`, checked; `bootstrap_means` resamples it with other figures."""
    _same_length(ref_correct, eng_correct)
    if resamples < MIN_RESAMPLES:
        raise UserError(
            f"bootstrap resamples must be at least {MIN_RESAMPLES} for a stable 95% interval; "
            f"got {resamples}"
        )
    if len(ref_correct) == 0:
        raise ValueError("paired bootstrap needs at least one image")
    delta = np.asarray(eng_correct, dtype=np.int64) - np.asarray(ref_correct, dtype=np.int64)
    return MeanBootstrap(delta, (CI_LEVEL,), resamples)


def paired_ci(change: MeanBootstrap, interval: Interval, seed: int) -> BootstrapCI:
    """`paired_bootstrap`'s result from its change (`paired_change`) and resampled interval."""
    _, low, high = interval
    delta = change.values
    return BootstrapCI(float(delta.sum() / len(delta)), low, high, change.resamples, seed)


def bootstrap_mean_intervals(
    values: np.ndarray, levels: tuple[float, ...], *, resamples: int, seed: int
) -> list[Interval]:
    """Percentile intervals on the mean of `values` at each level: (level, low, high).

    Per-image values such as KL are skewed (a few images carry most of the mean), so the
    interval comes from resampling images, not from a normal approximation. One set of
    resamples serves every level; draws as in `paired_bootstrap`. Empty input gives no
    intervals (the mean is undefined).
    """
    (out,) = bootstrap_means([MeanBootstrap(values, levels, resamples)], seed=seed)
    return out


def bootstrap_means(
    jobs: Sequence[MeanBootstrap], *, seed: int, workers: int = 1
) -> list[list[Interval]]:
    """`bootstrap_mean_intervals` of each job, value for value, each index draw made once.

    The draws depend only on the seed, the number of images and the resample: every job over
    as many images draws the same indices, and a job with fewer resamples draws a prefix of
    another's. A study scores several engines over the same images with one seed, and at
    50,000 images the draws cost more than the means, so they are drawn once per chunk for
    every job that reads them. `workers` threads gather the jobs' means (and draw the next
    chunk meanwhile); each resample's mean is computed as alone, so any number of workers
    gives the same values.
    """
    values = [np.asarray(job.values, dtype=np.float64) for job in jobs]
    means: list[np.ndarray | None] = [None] * len(jobs)
    by_size: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        if v.size:
            by_size.setdefault(v.size, []).append(i)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for members in by_size.values():
            resampled = _resampled_means(
                [values[i] for i in members], [jobs[i].resamples for i in members], seed, pool
            )
            for i, m in zip(members, resampled, strict=True):
                means[i] = m
    return [
        [] if m is None else _percentiles(m, job.levels) for job, m in zip(jobs, means, strict=True)
    ]


def _resampled_means(
    values: list[np.ndarray], resamples: list[int], seed: int, pool: ThreadPoolExecutor
) -> list[np.ndarray]:
    """Bootstrap means of each array (all of one length) from one stream of index draws.

    The draws come from `default_rng(seed)` in chunks of `_CHUNK_DRAWS // n` resamples, the
    last cut at the largest resample count: an array with fewer resamples reads a prefix of
    a chunk, which holds the values its own shorter draw would (a draw fills in order)."""
    n, total = values[0].size, max(resamples)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK_DRAWS // n)
    means: list[np.ndarray] = [np.empty(r, dtype=np.float64) for r in resamples]

    def draw(start: int) -> np.ndarray:
        return rng.integers(0, n, size=(min(start + per_chunk, total) - start, n))

    pending = pool.submit(draw, 0)
    for start in range(0, total, per_chunk):
        index = pending.result()
        if start + per_chunk < total:  # draws stay in order: the next starts after this one
            pending = pool.submit(draw, start + per_chunk)
        fills = [
            pool.submit(_fill, v, index[: r - start], m[start : start + per_chunk])
            for v, r, m in zip(values, resamples, means, strict=True)
            if r > start
        ]
        for fill in fills:
            fill.result()
    return means


def _fill(values: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """`out` = the mean of `values` over each row of `index`, as `values[index].mean(axis=1)`
    gives it: gathered a block of rows at a time into one buffer, so each block is still in
    cache when its means read it (`clip` only skips the bounds check: the indices are in
    range)."""
    per_block = max(1, _BLOCK_DRAWS // values.size)
    buffer: np.ndarray = np.empty((min(per_block, len(index)), values.size), dtype=np.float64)
    for start in range(0, len(index), per_block):
        rows = index[start : start + per_block]
        block = np.take(values, rows, mode="clip", out=buffer[: len(rows)])
        block.mean(axis=1, out=out[start : start + len(rows)])


def _percentiles(means: np.ndarray, levels: tuple[float, ...]) -> list[Interval]:
    """The percentile interval of the bootstrap means at each level."""
    out = []
    for level in levels:
        tail = (1.0 - level) / 2.0 * 100.0
        low, high = np.percentile(means, [tail, 100.0 - tail])
        out.append((level, float(low), float(high)))
    return out


def paired_mean_change(
    base: np.ndarray, other: np.ndarray, *, resamples: int, seed: int
) -> BootstrapCI:
    """95% percentile interval on mean(other - base) over the same images, resampled jointly:
    how two recipes differ in a per-image figure (KL, or 0/1 for a differing top-1), which the
    pairing measures far more tightly than the two means' own intervals."""
    _same_length(base, other)
    delta = np.asarray(other, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    if delta.size == 0:
        raise ValueError("a paired change needs at least one image")
    ((_, low, high),) = bootstrap_mean_intervals(delta, (CI_LEVEL,), resamples=resamples, seed=seed)
    return BootstrapCI(float(delta.mean()), low, high, resamples, seed)


def _same_length(*arrays: np.ndarray) -> None:
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"paired arrays differ in length: {sorted(lengths)}")
