"""KL, top-k, histogram, emulation gap and section assembly, on cases with known answers."""

import math

import numpy as np
import pytest
import torch

from quantstudy.quality.gap import emulation_gap
from quantstudy.quality.image_scores import kl_per_image
from quantstudy.quality.metrics import (
    KL_BIN_EDGES,
    RANDOM_WEIGHTS_REASON,
    build_quality_section,
    score_engine,
)
from quantstudy.quality.nonfinite import scan_nonfinite

torch.set_num_threads(1)


def random_logits(n: int = 64, c: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, c, generator=torch.Generator().manual_seed(seed))


def test_kl_zero_for_identical_logits():
    ref = random_logits()
    q = score_engine("fp16", ref, ref.clone(), None)
    assert (q.kl_mean, q.kl_median, q.kl_p99, q.kl_max) == (0.0, 0.0, 0.0, 0.0)
    assert q.max_abs_logit_diff == 0.0
    assert (q.agreement, q.differ_count) == (1.0, 0)


def test_kl_two_class_hand_computed_and_direction():
    ref = torch.tensor([[0.0, 0.0]])  # p = (1/2, 1/2)
    eng = torch.tensor([[math.log(3.0), 0.0]])  # q = (3/4, 1/4)
    expected = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KL(p || q)
    reverse = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # KL(q || p)
    q = score_engine("fp8", ref, eng, None)
    assert q.kl_mean == pytest.approx(expected, rel=1e-6)  # log(3) is rounded to float32
    assert q.kl_mean != pytest.approx(reverse, rel=1e-3)
    assert q.max_abs_logit_diff == pytest.approx(math.log(3.0), rel=1e-6)


def test_kl_is_invariant_to_a_constant_logit_shift():
    ref = random_logits(seed=3)
    assert np.allclose(kl_per_image(ref, ref + 7.0), 0.0, atol=1e-12)


def test_top1_top5_on_constructed_case():
    # Label 0 at rank 1, 5, 6 and 10 of 10 classes: top-1 hits 1 of 4, top-5 hits 2 of 4.
    ranks = [1, 5, 6, 10]
    logits = torch.tensor(
        [[11.0 - r] + [v for v in range(10, 0, -1) if v != 11 - r] for r in ranks]
    )
    assert [int((row > row[0]).sum()) + 1 for row in logits] == ranks  # construction check
    labels = torch.zeros(4, dtype=torch.long)
    q = score_engine("fp8", logits, logits.clone(), labels, bootstrap_resamples=1000)
    assert q.top1 == pytest.approx(0.25)
    assert q.top5 == pytest.approx(0.5)
    assert q.top1_reference == pytest.approx(0.25)


def test_unlabelled_scores_agreement_and_kl_only():
    ref = random_logits(seed=1)
    eng = ref.clone()
    eng[0] = eng[0].flip(0)  # change one prediction
    q = score_engine("fp8", ref, eng, None)
    assert not q.labelled
    assert q.top1 is None and q.gained is None and q.ci_low is None and q.mcnemar_p is None
    assert q.differ_count == 1
    assert q.kl_max > 0.0 and q.kl_median == 0.0


def test_kl_histogram_fixed_edges_with_underflow_and_overflow():
    ref = torch.tensor([[0.0, 0.0], [0.0, 0.0], [100.0, 0.0]])
    eng = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 100.0]])  # KL 0, 0.1438, ~100
    a = score_engine("fp8", ref, eng, None)
    b = score_engine("fp16", random_logits(), random_logits(seed=5), None)
    assert a.kl_bin_edges == b.kl_bin_edges == list(KL_BIN_EDGES)
    assert len(KL_BIN_EDGES) == 37
    assert KL_BIN_EDGES[0] == pytest.approx(1e-6) and KL_BIN_EDGES[-1] == pytest.approx(10.0)
    assert len(a.kl_histogram) == 36
    assert a.kl_histogram[0] == 1 and a.kl_histogram[-1] == 1 and sum(a.kl_histogram) == 3
    middle = int(np.searchsorted(KL_BIN_EDGES, 0.5 * math.log(4 / 3), side="right")) - 1
    assert a.kl_histogram[middle] == 1
    assert sum(b.kl_histogram) == 64


def test_nonfinite_rows_excluded_from_kl_and_counted_as_differing():
    ref = random_logits(n=8, seed=2)
    eng = ref.clone()
    eng[3, 4] = float("nan")
    eng[5, 0] = float("inf")
    labels = ref.argmax(dim=1)  # the reference is right everywhere
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000)
    assert math.isfinite(q.kl_mean) and q.kl_mean == 0.0
    assert q.max_abs_logit_diff == 0.0
    assert sum(q.kl_histogram) == 6
    assert q.differ_count == 2 and q.lost == 2 and q.gained == 0
    assert q.top1 == pytest.approx(6 / 8)


def test_all_rows_nonfinite_gives_undefined_kl_not_a_number_that_looks_fine():
    ref = random_logits(n=4)
    eng = torch.full_like(ref, float("nan"))
    q = score_engine("fp8", ref, eng, None)
    assert math.isnan(q.kl_mean) and q.differ_count == 4 and q.agreement == 0.0


def test_emulation_gap_compares_images_directly():
    fq = random_logits(n=50, seed=4)
    fp8 = fq.clone()
    for i in (2, 11, 40):
        fp8[i] = fp8[i].flip(0)
    gap = emulation_gap(fp8, fq)
    assert gap.differ_count == 3
    assert gap.agreement == pytest.approx(47 / 50)
    assert gap.kl_max > 0.0
    two_fq = torch.tensor([[0.0, 0.0]])
    two_fp8 = torch.tensor([[math.log(3.0), 0.0]])
    assert emulation_gap(two_fp8, two_fq).kl_mean == pytest.approx(0.5 * math.log(4 / 3))


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="one shape"):
        score_engine("fp8", random_logits(n=4), random_logits(n=5), None)
    with pytest.raises(ValueError, match="labels"):
        score_engine("fp8", random_logits(n=4), random_logits(n=4), torch.zeros(3))


def _section(random_weights: bool, labels: torch.Tensor):
    ref = random_logits(n=len(labels), c=5, seed=0)
    eng = random_logits(n=len(labels), c=5, seed=1)
    q = score_engine("fp8", ref, eng, labels, bootstrap_resamples=1000)
    stress = torch.zeros(2, 5)
    stress[1, 0] = float("nan")
    scan = scan_nonfinite("fp8", eng, [f"img{i}" for i in range(len(labels))], stress, ["a", "b"])
    return build_quality_section("fp32", [q], [scan], ["a", "b"], labels, None, random_weights)


def test_section_collects_warnings_and_marks_random_weights():
    labels = torch.tensor([0] * 30 + [1] * 10)  # imbalanced, 40 images
    section = _section(True, labels)
    assert not section.meaningful
    assert section.meaningless_reason == RANDOM_WEIGHTS_REASON
    assert (section.n_classes, section.per_class_min, section.per_class_max) == (2, 10, 30)
    text = "\n".join(section.warnings)
    assert "class-imbalanced" in text
    assert "fp8: only 40 held-out images" in text
    assert "fp8: NaN/Inf logits on 1 of 2 stress inputs (b)" in text
    assert section.stress_inputs == ["a", "b"]


def test_section_meaningful_with_real_weights():
    section = _section(False, torch.tensor([0, 1] * 20))
    assert section.meaningful and section.meaningless_reason is None
    assert not any("imbalanced" in w for w in section.warnings)


def test_emulation_gap_splits_the_images_only_one_of_the_two_gets_wrong():
    """Against fp32: the engine alone differs on 3 images, the emulation alone on 1, both on 1;
    McNemar's exact p on the 3-1 split is the binomial test's."""
    from scipy.stats import binomtest

    ref = random_logits(n=40, seed=5)
    fq, fp8 = ref.clone(), ref.clone()
    for i in (1, 2, 3):
        fp8[i] = fp8[i].flip(0)
    fq[7] = fq[7].flip(0)
    fq[9], fp8[9] = fq[9].flip(0), fp8[9].flip(0)
    gap = emulation_gap(fp8, fq, reference_logits=ref)
    assert (gap.engine_only_differ, gap.emulation_only_differ) == (3, 1)
    assert gap.split_mcnemar_p == pytest.approx(binomtest(1, 4).pvalue)
    assert gap.differ_count == 4  # the engine against its emulation: images 1, 2, 3 and 7
    assert emulation_gap(fp8, fq).engine_only_differ is None
    assert gap.floor_only_differ is None  # no reordered run given


def test_emulation_gap_splits_the_floor_run_the_same_way():
    """The reordered run alone differs from fp32 on 2 images, the emulation alone on 1: the
    floor's split, the scale for the engine's."""
    from scipy.stats import binomtest

    ref = random_logits(n=40, seed=8)
    fq, fp8, reordered = ref.clone(), ref.clone(), ref.clone()
    for i in (4, 5):
        reordered[i] = reordered[i].flip(0)
    fq[6] = fq[6].flip(0)
    gap = emulation_gap(fp8, fq, reordered, ref)
    assert (gap.floor_only_differ, gap.floor_emulation_only_differ) == (2, 1)
    assert gap.floor_split_mcnemar_p == pytest.approx(binomtest(1, 3).pvalue)
    assert (gap.engine_only_differ, gap.emulation_only_differ) == (0, 1)
    assert gap.floor_differ_count == 3  # reordered against the emulation: images 4, 5 and 6


def test_emulation_gap_scores_the_float32_engine_against_the_emulation():
    fq = random_logits(n=30, seed=6)
    wide = fq.clone()
    wide[4] = wide[4].flip(0)
    gap = emulation_gap(fq.clone(), fq, float32_logits=wide)
    assert gap.float32_differ_count == 1 and gap.float32_agreement == pytest.approx(29 / 30)
    assert gap.differ_count == 0 and emulation_gap(fq, fq).float32_differ_count is None


def test_emulation_gap_scores_the_half_storage_floor_with_its_dtype():
    fq = random_logits(n=20, seed=7)
    half = fq.clone()
    half[3], half[11] = half[3].flip(0), half[11].flip(0)
    gap = emulation_gap(fq.clone(), fq, half_storage=(half, torch.float16))
    assert (gap.half_floor_dtype, gap.half_floor_differ_count) == ("float16", 2)
    assert gap.half_floor_agreement == pytest.approx(18 / 20) and gap.half_floor_kl_mean > 0
    assert emulation_gap(fq, fq).half_floor_dtype is None
