"""Quality of one engine against the fp32 reference on the held-out set, as record sections.

`score_engine` gives what the seed reviews asked for, each as its own number: top-1/top-5 against
labels, agreement with fp32 as a count of differing images, the net change in correct predictions
split into gained and lost (plus wrong-to-wrong), McNemar's exact p and a paired bootstrap interval,
and KL(fp32 || engine) per image. `quality/gap.py` compares the FP8 engine with its own fake-quant
emulation image by image.

Non-finite logits: a row holding a NaN or Inf is a broken prediction. It counts as a differing,
incorrect prediction (never as agreement or as a hit), and it is left out of the KL statistics,
the KL histogram and the max logit difference, which are computed over rows finite in both
engines; `nonfinite.scan_nonfinite` names those rows, and `build_quality_section` warns about them.
If no row is finite in both, the KL figures are NaN (undefined), never a silent average.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from quantstudy.quality.balance import precision_warnings, sample_balance
from quantstudy.quality.image_scores import PairRows, Predictions, RowSet
from quantstudy.quality.image_scores import kl_per_image as kl_per_image  # where callers import it
from quantstudy.quality.image_scores import topk_correct as topk_correct
from quantstudy.quality.paired import (
    CI_LEVEL,
    BootstrapCI,
    Interval,
    MeanBootstrap,
    bootstrap_means,
    mcnemar_exact,
    paired_change,
    paired_ci,
    paired_counts,
)
from quantstudy.record import (
    EmulationGap,
    EngineQuality,
    MeanInterval,
    NonFiniteScan,
    QualitySection,
)

# Fixed, log-spaced KL bins shared by every engine and study, so histograms compare directly:
# 36 bins from 1e-6 to 10 nats; smaller values (including 0) land in the first bin, larger in the
# last.
KL_BIN_EDGES: tuple[float, ...] = tuple(float(e) for e in np.logspace(-6.0, 1.0, 37))
# Levels of the KL-mean bootstrap intervals kept in the record: a policy's confidence must be
# one of them for its KL gate (the per-image KL values are not kept). Enough resamples that the
# 0.999 interval's tails hold 5 draws each.
KL_INTERVAL_LEVELS: tuple[float, ...] = (0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
KL_RESAMPLES = 10_000
RANDOM_WEIGHTS_REASON = (
    "random weights: accuracy numbers are meaningless; agreement and KL still compare engines"
)


@dataclass(frozen=True)
class KLStats:
    """Summary of per-image KL values (nats); NaN when there are no values."""

    mean: float
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, kl: np.ndarray) -> KLStats:
        if kl.size == 0:
            nan = float("nan")
            return cls(mean=nan, median=nan, p99=nan, max=nan)
        return cls(
            mean=float(kl.mean()),
            median=float(np.median(kl)),
            p99=float(np.percentile(kl, 99)),
            max=float(kl.max()),
        )


def kl_histogram(kl: np.ndarray) -> list[int]:
    """Counts of `kl` over `KL_BIN_EDGES`, out-of-range values clipped into the end bins."""
    clipped = np.clip(kl, KL_BIN_EDGES[0], KL_BIN_EDGES[-1])
    counts, _ = np.histogram(clipped, bins=np.asarray(KL_BIN_EDGES))
    return [int(c) for c in counts]


def max_abs_logit_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference between two finite logit tensors (0.0 when empty)."""
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def score_engine(
    engine: str,
    ref_logits: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    bootstrap_resamples: int = 2000,
    seed: int = 0,
) -> EngineQuality:
    """Score one engine's held-out logits against the fp32 reference's, image by image.

    Agreement, differing count, KL(fp32 || engine) and the max logit difference need no labels.
    With labels also: top-1, top-5 and the reference's top-1, gained/lost/wrong-to-wrong counts,
    McNemar's exact p, and a paired bootstrap 95% CI on the top-1 change (fractions, not points).
    Non-finite rows are handled as the module docstring says: wrong and differing, and left out of
    KL and the logit difference (the non-finite scan names them).
    """
    label_array = check_logits(ref_logits, logits, labels)
    rows = RowSet.of({"ref": ref_logits, engine: logits}, [("ref", engine)], label_array)
    return score_rows(
        engine, rows, "ref", label_array, bootstrap_resamples=bootstrap_resamples, seed=seed
    )


def score_rows(
    engine: str,
    rows: RowSet,
    reference: str,
    labels: np.ndarray | None,
    *,
    bootstrap_resamples: int = 2000,
    seed: int = 0,
) -> EngineQuality:
    """`score_engine` from per-image rows (`quality/image_scores.py`): `rows` holds both engines and
    the pair (reference, engine); the streamed held-out pass scores through this."""
    (quality,) = score_many(
        [(engine, reference)], rows, labels, bootstrap_resamples=bootstrap_resamples, seed=seed
    )
    return quality


def score_many(
    comparisons: list[tuple[str, str]],
    rows: RowSet,
    labels: np.ndarray | None,
    *,
    bootstrap_resamples: int = 2000,
    seed: int = 0,
    workers: int = 1,
) -> list[EngineQuality]:
    """`score_rows` of each (engine, reference) in `comparisons`, value for value (`rows`
    holds each pair as (reference, engine)).

    A study's bootstraps all resample its held-out images with one seed, so their index
    draws are the same: `bootstrap_means` makes them once for every interval instead of twice
    per engine, the bulk of scoring 50,000 images. `workers`: threads for the resampling
    (any number gives the same values)."""
    scored = [_Scored.of(e, rows, r, labels, bootstrap_resamples) for e, r in comparisons]
    jobs = [job for s in scored for job in s.jobs]
    intervals = iter(bootstrap_means(jobs, seed=seed, workers=workers))
    return [s.quality(intervals, seed) for s in scored]


@dataclass(frozen=True)
class _Scored:
    """One engine against its reference before the bootstraps: the per-image figures, and
    the means to resample (KL, then the paired change in correctness when labelled)."""

    engine: str
    ref: Predictions
    eng: Predictions
    pair: PairRows
    agree: np.ndarray
    labels: np.ndarray | None
    kl: MeanBootstrap
    change: MeanBootstrap | None

    @classmethod
    def of(
        cls,
        engine: str,
        rows: RowSet,
        reference: str,
        labels: np.ndarray | None,
        resamples: int,
    ) -> _Scored:
        ref, eng = rows.engines[reference], rows.engines[engine]
        pair = rows.pairs[(reference, engine)]
        change = None
        if labels is not None:
            change = paired_change(ref.correct(labels), eng.correct(labels), resamples=resamples)
        kl = MeanBootstrap(pair.finite_kl, KL_INTERVAL_LEVELS, KL_RESAMPLES)
        return cls(engine, ref, eng, pair, ref.agrees_with(eng), labels, kl, change)

    @property
    def jobs(self) -> list[MeanBootstrap]:
        return [self.kl] if self.change is None else [self.kl, self.change]

    def quality(self, intervals: Iterator[list[Interval]], seed: int) -> EngineQuality:
        """The record's section, taking this engine's intervals (`jobs`' order) from
        `intervals`."""
        kl_intervals = next(intervals)
        labelled = {}
        if self.change is not None and self.labels is not None:
            (interval,) = next(intervals)
            ci = paired_ci(self.change, interval, seed)
            labelled = _labelled_fields(self.ref, self.eng, self.agree, self.labels, ci)
        kl, agree = self.kl.values, self.agree
        stats = KLStats.of(kl)
        n = int(agree.size)
        return EngineQuality(
            engine=self.engine,
            n_images=n,
            labelled=self.labels is not None,
            agreement=float(agree.mean()),
            differ_count=int(n - agree.sum()),
            kl_mean=stats.mean,
            kl_median=stats.median,
            kl_p99=stats.p99,
            kl_max=stats.max,
            max_abs_logit_diff=self.pair.max_abs_logit_diff,
            kl_histogram=kl_histogram(kl),
            kl_bin_edges=list(KL_BIN_EDGES),
            kl_mean_intervals=[
                MeanInterval(level=level, low=low, high=high) for level, low, high in kl_intervals
            ],
            **labelled,
        )


def build_quality_section(
    reference: str,
    engines: list[EngineQuality],
    scans: list[NonFiniteScan],
    stress_names: list[str],
    labels: torch.Tensor | None,
    gap: EmulationGap | None,
    random_weights: bool,
    against_fp16: EngineQuality | None = None,
) -> QualitySection:
    """Assemble the quality section; warnings: sample balance, precision, non-finite rows.

    `against_fp16` is the FP8 engine scored with the fp16 engine as its reference
    (`score_engine("fp8", fp16_logits, fp8_logits, labels)`): the paired evidence for decision
    gates whose baseline is fp16."""
    n_classes, per_class_min, per_class_max, warnings = sample_balance(labels)
    for q in engines:
        warnings.extend(precision_warnings(q))
    warnings.extend(w for scan in scans for w in nonfinite_warnings(scan))
    return QualitySection(
        reference=reference,
        engines=engines,
        emulation_gap=gap,
        against_fp16=against_fp16,
        nonfinite=scans,
        stress_inputs=list(stress_names),
        n_classes=n_classes,
        per_class_min=per_class_min,
        per_class_max=per_class_max,
        warnings=warnings,
        meaningful=not random_weights,
        meaningless_reason=RANDOM_WEIGHTS_REASON if random_weights else None,
    )


def nonfinite_warnings(scan: NonFiniteScan, shown: int = 5) -> list[str]:
    """One warning per engine with NaN/Inf logits, naming the first `shown` rows of each kind."""
    parts = []
    if scan.nonfinite_heldout:
        parts.append(
            f"{len(scan.nonfinite_heldout)} of {scan.heldout_checked} held-out images "
            f"({_first(scan.nonfinite_heldout, shown)}); KL and logit difference exclude them"
        )
    if scan.nonfinite_stress:
        parts.append(
            f"{len(scan.nonfinite_stress)} of {scan.stress_checked} stress inputs "
            f"({_first(scan.nonfinite_stress, shown)})"
        )
    if not parts:
        return []
    return [f"{scan.engine}: NaN/Inf logits on " + "; and on ".join(parts)]


def _first(names: list[str], shown: int) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", and {more} more" if more > 0 else "")


def _labelled_fields(
    ref: Predictions,
    eng: Predictions,
    agree: np.ndarray,
    labels: np.ndarray,
    ci: BootstrapCI,
) -> dict[str, float | int]:
    """The EngineQuality fields that need labels (both predictions hold their top-5 hits),
    with the paired bootstrap interval `ci` on the top-1 change."""
    if ref.top5 is None or eng.top5 is None:
        raise ValueError("labelled scoring needs rows made with the labels")
    ref_correct, eng_correct = ref.correct(labels), eng.correct(labels)
    counts = paired_counts(ref_correct, eng_correct, agree)
    return {
        "top1": float(eng_correct.mean()),
        "top5": float(eng.top5.mean()),
        "top1_reference": float(ref_correct.mean()),
        "top5_reference": float(ref.top5.mean()),
        "ci_level": CI_LEVEL,
        "gained": counts.gained,
        "lost": counts.lost,
        "wrong_to_wrong": counts.wrong_to_wrong,
        "net_change": counts.net_change,
        "top1_change": ci.change,
        "ci_low": ci.low,
        "ci_high": ci.high,
        "bootstrap_resamples": ci.resamples,
        "bootstrap_seed": ci.seed,
        "mcnemar_p": mcnemar_exact(counts.gained, counts.lost),
    }


def check_logits(
    ref_logits: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor | None
) -> np.ndarray | None:
    """Check shapes and label range (internal contract); return labels as an int64 array."""
    if ref_logits.dim() != 2 or ref_logits.shape != logits.shape:
        raise ValueError(
            f"logits must be two (N, C) tensors of one shape, got {tuple(ref_logits.shape)} "
            f"and {tuple(logits.shape)}"
        )
    if ref_logits.shape[0] == 0:
        raise ValueError("no images to score")
    if labels is None:
        return None
    label_array = labels.cpu().numpy().astype(np.int64).reshape(-1)
    if label_array.shape[0] != ref_logits.shape[0]:
        raise ValueError(f"{label_array.shape[0]} labels for {ref_logits.shape[0]} images")
    if label_array.min() < 0 or label_array.max() >= ref_logits.shape[1]:
        raise ValueError(f"labels must lie in [0, {ref_logits.shape[1]}), got out-of-range values")
    return label_array
