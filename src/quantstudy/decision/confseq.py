"""The confidence sequence behind the sequential decision: PrPl-EB for means in [0, 1].

Waudby-Smith and Ramdas (`SOURCE`, Theorem 2): with predictable bets lambda_i in [0, 1) and
predictable means m_i (both fixed before X_i is seen), for observations X_i in [0, 1] with a
common conditional mean,
      C_n = sum(lambda_i X_i) / sum(lambda_i)
            +- (log(2 / alpha) + sum((X_i - m_i)^2 psi(lambda_i))) / sum(lambda_i),
      psi(l) = -log(1 - l) - l,
holds the mean at every n at once with probability at least 1 - alpha. It needs no
distribution, only the bounds, and adapts to the variance. Bets follow the paper's plug-in rule
lambda = min(sqrt(2 log(2/alpha) / (s^2 n log(1 + n))), `TRUNCATION`), with s^2 the variance of
the observations before the bet (prior 1/4, as in the paper) and n the count at the end of the
bet; m is the paper's (1/2 + sum) / (count + 1). Bets and means are refreshed every `BET_BLOCK`
observations (any predictable choice keeps the guarantee), so all the sequence needs per block
is its count, sum and sum of squares: the study's looks and the simulation of 10,000 studies
(`simulate.py`) run the same code on those. Running intersection: the interval at a block end
is intersected with every earlier one (valid: the sequence holds at all those sizes at once).

Written here rather than taken from the `confseq` package: the closed form is a few lines of
numpy and vectorises over simulated studies, and `confseq` would be a compiled dependency on
every machine the study runs on.
"""

from __future__ import annotations

import math

import numpy as np

from quantstudy.record.vocab import Direction

METHOD = "predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB)"
SOURCE = (
    "Waudby-Smith, I. and Ramdas, A., Estimating means of bounded random variables by "
    "betting, J. R. Stat. Soc. B 86(1):1-27 (2024), arXiv:2010.09686, Theorem 2"
)
BET_BLOCK = 100  # images per bet: a smaller block bets closer to the paper's per-image rule
TRUNCATION = 0.75  # the largest bet; the paper suggests 1/2 or 3/4 (3/4 narrows low-variance KL)

OPEN, PASS, FAIL = 0, 1, 2  # first_verdicts codes


def block_stats(x: np.ndarray, block: int = BET_BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, sum and sum of squares of `x` (values in [0, 1]) per block of `block` images;
    the last block holds the remainder."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    starts = np.arange(0, x.size, block)
    count: np.ndarray = np.diff(np.append(starts, x.size)).astype(np.float64)
    return count, np.add.reduceat(x, starts), np.add.reduceat(x * x, starts)


def confidence_sequence(
    count: np.ndarray, total: np.ndarray, total_sq: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """PrPl-EB lower and upper bounds at every block end, running-intersected.

    Inputs are per-block statistics of observations in [0, 1] along the last axis (leading
    axes: independent studies, for the simulation). Bet and mean of block k come from blocks
    before k only, so they are predictable."""
    n_end = np.cumsum(count, axis=-1)
    n_before = n_end - count
    s_before = np.cumsum(total, axis=-1) - total
    q_before = np.cumsum(total_sq, axis=-1) - total_sq
    mean_prior = (0.5 + s_before) / (n_before + 1.0)  # the paper's predictable mean
    spread = np.maximum(q_before - s_before * s_before / np.maximum(n_before, 1.0), 0.0)
    var = (0.25 + spread) / (n_before + 1.0)
    log_term = math.log(2.0 / alpha)
    bet = np.minimum(np.sqrt(2.0 * log_term / (var * n_end * np.log1p(n_end))), TRUNCATION)
    dev = total_sq - 2.0 * mean_prior * total + count * mean_prior * mean_prior
    psi = -np.log1p(-bet) - bet
    weight = np.cumsum(bet * count, axis=-1)
    center = np.cumsum(bet * total, axis=-1) / weight
    margin = (log_term + np.cumsum(psi * np.maximum(dev, 0.0), axis=-1)) / weight
    lower = np.maximum.accumulate(np.clip(center - margin, 0.0, 1.0), axis=-1)
    upper = np.minimum.accumulate(np.clip(center + margin, 0.0, 1.0), axis=-1)
    return lower, upper


def first_verdicts(
    lower: np.ndarray, upper: np.ndarray, threshold: float, direction: Direction
) -> tuple[np.ndarray, np.ndarray]:
    """The first verdict along the last axis and the index where it came (size if never).

    Codes: 0 open, 1 pass, 2 fail; pass and fail follow `gates.status_of` (a pass on the
    threshold itself, a fail strictly beyond it)."""
    if direction == Direction.AT_LEAST:
        passing, failing = lower >= threshold, upper < threshold
    else:
        passing, failing = upper <= threshold, lower > threshold
    size = lower.shape[-1]
    at_pass = np.where(passing.any(axis=-1), passing.argmax(axis=-1), size)
    at_fail = np.where(failing.any(axis=-1), failing.argmax(axis=-1), size)
    code = np.where(at_pass <= at_fail, PASS, FAIL)
    at = np.minimum(at_pass, at_fail)
    return np.where(at < size, code, OPEN), at
