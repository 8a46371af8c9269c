"""The decision on quality scored from constructed logits, where the truth is known.

Logits are built so that each image's top-1 is chosen: the quality stage (`score_engine`) scores
them as in a study, and the decision reads only what it recorded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _records import build_record

from quantstudy.decision.policy import decide, load_policy
from quantstudy.decision.stats import POWER, paired_change_interval
from quantstudy.quality.metrics import build_quality_section, score_engine
from quantstudy.quality.nonfinite import scan_nonfinite
from quantstudy.record import StudyRecord
from quantstudy.record.vocab import GateStatus, Outcome

CLASSES = 10
FAST = {1: 1.12, 32: 1.09, 128: 1.10}


def _engine_logits(tops: list[np.ndarray]) -> list[torch.Tensor]:
    """(N, CLASSES) logits per engine whose argmax is that engine's top-1. Classes any engine
    picks sit close together (8.0 for the engine's own, 7.9 for the others'), so engines that
    differ on an image differ by a near tie, as quantization noise does: small KL."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(len(tops[0]), CLASSES, generator=g, dtype=torch.float64)
    rows = torch.arange(len(tops[0]))
    out = []
    for top in tops:
        x = base.clone()
        for other in tops:
            x[rows, torch.from_numpy(other)] = 7.9
        x[rows, torch.from_numpy(top)] = 8.0
        out.append(x.float())
    return out


def _record(labels: np.ndarray, fp32: np.ndarray, fp16: np.ndarray, fp8: np.ndarray):
    """The constructed study record with quality scored from the three engines' top-1s."""
    y = torch.from_numpy(labels)
    ref, half, eight = _engine_logits([fp32, fp16, fp8])
    ids = [f"img{i}" for i in range(len(labels))]
    stress = torch.zeros(1, CLASSES)
    scans = [
        scan_nonfinite(name, t, ids, stress, ["zeros"])
        for name, t in (("fp32", ref), ("fp16", half), ("fp8", eight))
    ]
    scored = [
        score_engine(n, ref, t, y, bootstrap_resamples=1000)
        for n, t in (("fp16", half), ("fp8", eight))
    ]
    quality = build_quality_section(
        "fp32",
        scored,
        scans,
        ["zeros"],
        y,
        None,
        False,
        against_fp16=score_engine("fp8", half, eight, y, bootstrap_resamples=1000),
    )
    base = build_record(speedup=FAST, with_decision=False)
    return base.model_copy(update={"quality": quality})


def _decide(record: StudyRecord):
    return decide(record, *load_policy(None))


def _gate(d, name: str):
    return next(g for g in d.gates if g.name == name)


def _flip(top1: np.ndarray, idx: np.ndarray) -> np.ndarray:
    out = top1.copy()
    out[idx] = (out[idx] + 1) % CLASSES
    return out


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, CLASSES, size=3000)


def test_identical_engines_pass_every_quality_gate(labels):
    fp32 = _flip(labels, np.arange(0, 3000, 5))  # 80% top-1
    d = _decide(_record(labels, fp32, fp32, fp32))
    quality = [g for g in d.gates if g.kind == "quality"]
    assert all(g.status == GateStatus.PASS for g in quality), quality
    assert _gate(d, "top-1 change").value == 0.0
    assert _gate(d, "top-1 agreement").value == 1.0
    assert d.outcome == Outcome.SHIP


def test_clearly_worse_engine_is_not_shipped(labels):
    fp32 = _flip(labels, np.arange(0, 3000, 5))
    right = np.flatnonzero(fp32 == labels)
    fp8 = _flip(fp32, right[::10])  # 8% of images turn wrong: 8 points lost, agreement 92%
    d = _decide(_record(labels, fp32, fp32, fp8))
    assert d.outcome == Outcome.NOT_SHIP
    assert {"top-1 change", "top-1 agreement"} <= set(d.failed)


def test_marginal_engine_on_few_images_is_inconclusive_with_a_simulated_figure(labels):
    n = 600
    y = labels[:n]
    fp32 = _flip(y, np.arange(0, n, 5))
    right, wrong = np.flatnonzero(fp32 == y), np.flatnonzero(fp32 != y)
    fp8 = fp32.copy()
    fp8[right[:5]] = (fp8[right[:5]] + 1) % CLASSES  # 5 lost
    fp8[wrong[:3]] = y[wrong[:3]]  # 3 gained: a 0.33-point loss, inside the 0.5 margin
    d = _decide(_record(y, fp32, fp32, fp8))
    g = _gate(d, "top-1 change")
    assert g.status == GateStatus.INCONCLUSIVE and d.outcome == Outcome.INCONCLUSIVE
    assert g.low < g.threshold < g.high
    # simulate studies of `needed` images at the observed rates: about POWER of them settle
    pg, pl = 3 / n, 5 / n

    def settled(m: int) -> float:
        rng = np.random.default_rng(m)
        hits = 0
        for gained, lost, _ in rng.multinomial(m, [pg, pl, 1 - pg - pl], size=300):
            low, high = paired_change_interval(int(gained), int(lost), m, 0.95)
            hits += low >= g.threshold or high < g.threshold
        return hits / 300

    lo, hi = 100, 1_000_000
    while hi / lo > 1.03:
        mid = int((lo * hi) ** 0.5)
        lo, hi = (lo, mid) if settled(mid) >= POWER else (mid, hi)
    assert abs(g.images_needed - hi) / hi < 0.2, (g.images_needed, hi)


def test_fp16_against_fp32_alone_is_not_not_ship(labels):
    """fp16 agreeing on all but a few images is never refused by the top-1 gate."""
    fp32 = _flip(labels, np.arange(0, 3000, 5))
    fp16 = _flip(fp32, np.array([3, 7]))
    d = _decide(_record(labels, fp32, fp32, fp16))
    assert _gate(d, "top-1 change").status != GateStatus.FAIL
