"""The sequential decision: its confidence sequence, checked against its formula and by
simulation, and the looks a study records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _records import build_record
from scipy.stats import norm

from quantstudy.decision import confseq, sequential_gates
from quantstudy.decision import sequential as seq
from quantstudy.decision.gates import AGREEMENT, FINITE, KL_MEAN, TOP1
from quantstudy.decision.policy import decide
from quantstudy.decision.schema import Policy
from quantstudy.decision.simulate import Case, cases, simulate
from quantstudy.record import StudyRecord
from quantstudy.record.vocab import GateStatus, Missing, Outcome, StopReason
from quantstudy.report.markdown import render_markdown
from quantstudy.report.meaning import check_meaning
from quantstudy.report.plots import available_plots, write_plots
from quantstudy.report.selfcheck import check_markdown
from quantstudy.report.sequential_plot import SEQUENTIAL_PNG

POLICY = Policy()
STUDIES = 10_000
# 30,000 images (60 looks of 500) keep the nine cases near 10 s on the CI machine; the
# committed figures (`tools/lab/sequential_sim.py`) go to 50,000.
MAX_IMAGES = 30_000


# --- the sequence against its formula ---------------------------------------------------------


def _reference_bounds(x: np.ndarray, alpha: float, block: int) -> tuple[float, float]:
    """Theorem 2's PrPl-EB interval after every image, written image by image as in the paper
    (bets and predictable means frozen per block), running-intersected at block ends and at the
    end; an independent loop to hold `confidence_sequence` to the formula."""
    log_term = math.log(2.0 / alpha)
    lam_sum = lam_x = var_term = 0.0
    low, high = 0.0, 1.0
    for start in range(0, x.size, block):
        seen = x[:start]
        m = (0.5 + seen.sum()) / (start + 1)
        s2 = (0.25 + ((seen - seen.mean()) ** 2).sum() if start else 0.25) / (start + 1)
        end = min(start + block, x.size)
        lam = min(math.sqrt(2 * log_term / (s2 * end * math.log(1 + end))), confseq.TRUNCATION)
        psi = -math.log(1 - lam) - lam
        for xi in x[start:end]:
            lam_sum += lam
            lam_x += lam * xi
            var_term += (xi - m) ** 2 * psi
        center, margin = lam_x / lam_sum, (log_term + var_term) / lam_sum
        low, high = max(low, center - margin), min(high, center + margin)
    return low, high


@pytest.mark.parametrize("p", [0.03, 0.5, 0.97])
def test_the_sequence_follows_the_papers_formula(p):
    x = (np.random.default_rng(1).random(1234) < p).astype(float)
    lower, upper = confseq.confidence_sequence(*confseq.block_stats(x), 0.05)
    low, high = _reference_bounds(x, 0.05, confseq.BET_BLOCK)
    assert lower[-1] == pytest.approx(low, abs=1e-12)
    assert upper[-1] == pytest.approx(high, abs=1e-12)


def test_the_interval_narrows_and_is_wider_than_a_fixed_n_one():
    """Time-uniform validity costs width: at every look the sequence is wider than the
    fixed-n normal interval at the same level, and it never widens."""
    x = (np.random.default_rng(2).random(20_000) < 0.97).astype(float)
    lower, upper = confseq.confidence_sequence(*confseq.block_stats(x), 0.05)
    assert np.all(np.diff(lower) >= 0) and np.all(np.diff(upper) <= 0)
    n = np.arange(1, lower.size + 1) * confseq.BET_BLOCK
    mean = np.cumsum(confseq.block_stats(x)[1]) / n
    wald = norm.ppf(0.975) * np.sqrt(mean * (1 - mean) / n)
    assert np.all(upper - lower > 2 * wald)


# --- simulation: wrong verdicts and stopping size -------------------------------------------


@pytest.mark.parametrize("case", cases(POLICY), ids=lambda c: f"{c.gate}-{c.label}")
def test_wrong_verdicts_stay_within_alpha(case):
    """10,000 simulated studies per case, a look every 500 images up to 30,000. The guarantee
    is alpha / 2 per side (alpha with the truth on the threshold, where either verdict is
    wrong); the assertion allows three Monte Carlo standard errors at that bound (about 0.005
    at 0.025 over 10,000 studies), so only a rate measurably above the guarantee fails."""
    r = simulate(case, POLICY, studies=STUDIES, max_images=MAX_IMAGES)
    print(
        f"\n{case.gate} {case.label} (truth {case.truth:.4f}, threshold {r.threshold:.4f}): "
        f"wrong {r.wrong:.4f} +- {r.wrong_se:.4f} (bound {r.wrong_bound:.3f}); pass "
        f"{r.passed:.3f}, fail {r.failed:.3f}, open {r.open:.3f}; mean stop "
        f"{r.mean_stop:.0f} images, median {r.median_stop:.0f}"
    )
    assert r.wrong <= r.wrong_bound + 3 * r.wrong_se
    if case.label != "at":
        # Away from the threshold most studies settle, and on the right side: a procedure that
        # never settles would pass the bound above trivially.
        right = r.failed if (case.label == "below") == (case.gate != KL_MEAN) else r.passed
        assert right >= 0.5, right


def _naive_intervals(count, total, total_sq, alpha):
    """The fixed-n normal interval recomputed at every look: invalid under optional stopping."""
    n = np.cumsum(count, axis=-1)
    mean = np.cumsum(total, axis=-1) / n
    half = norm.ppf(1 - alpha / 2) * np.sqrt(np.maximum(mean * (1 - mean), 1e-12) / n)
    return mean - half, mean + half


def test_the_simulation_catches_fixed_n_intervals_looked_at_every_round():
    """The harness can fail: fixed-n intervals at 95%, looked at after every round, settle
    wrongly far more often than 5% when the truth sits on the threshold."""
    case = Case(AGREEMENT, "at", (0.0, 1.0), (0.03, 0.97))
    naive = simulate(case, POLICY, studies=2_000, max_images=MAX_IMAGES, intervals=_naive_intervals)
    assert naive.wrong > 4 * naive.wrong_bound, naive.wrong


def test_simulation_refuses_rounds_that_split_a_bet():
    with pytest.raises(ValueError, match="multiple of"):
        simulate(cases(POLICY)[0], POLICY, studies=10, round_size=150)


# --- looks ----------------------------------------------------------------------------------


def _per_image(
    n: int, change: float = 0.02, seed: int = 0, labels: bool = True, kl_scale: float = 0.01
) -> seq.PerImage:
    """`change` of images get another top-1 from FP8 than from fp32 (= fp16 here)."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 1000, n)
    fp32 = np.where(rng.random(n) < 0.75, truth, rng.integers(0, 1000, n))
    fp8 = np.where(rng.random(n) < change, rng.integers(0, 1000, n), fp32)
    kl = rng.gamma(0.5, kl_scale, n)
    return seq.PerImage(
        top1={"fp32": fp32, "fp16": fp32.copy(), "fp8": fp8},
        labels=truth if labels else None,
        kl={("fp32", "fp8"): kl},
        nonfinite={"fp32": 0, "fp16": 0, "fp8": 0},
    )


def _gate(look, name):
    return next(g for g in look.gates if g.name == name)


def test_a_look_settles_gates_and_keeps_the_verdicts():
    per = _per_image(20_000, change=0.02)
    looks, prev = [], None
    for n in range(1000, 20_001, 1000):
        prev = seq.look(per, POLICY, n, previous=prev)
        looks.append(prev)
    # fp8 moves 2% of predictions, 3/4 of them away from a right answer: a 1.5-point loss
    # fails the 0.5-point margin; 98% agreement passes the 97% minimum; KL mean 0.005 passes.
    last = looks[-1]
    assert seq.settled(last)
    assert [g.status for g in last.gates] == [
        GateStatus.FAIL,
        GateStatus.PASS,
        GateStatus.PASS,
        GateStatus.PASS,
    ]
    for name in (TOP1, AGREEMENT, KL_MEAN):
        lows = [_gate(lk, name).lower for lk in looks]
        highs = [_gate(lk, name).upper for lk in looks]
        assert lows == sorted(lows) and highs == sorted(highs, reverse=True), name
        g = _gate(last, name)
        first = next(lk for lk in looks if _gate(lk, name).status == g.status)
        assert g.settled_at is not None and g.settled_at <= first.images
        assert all(_gate(lk, name).status == g.status for lk in looks if lk.images >= first.images)
    top1 = _gate(last, TOP1)
    assert top1.lower <= top1.estimate <= top1.upper < POLICY.quality.top1.threshold


def test_looks_at_any_round_size_agree_on_the_verdict():
    """Rounds that split a bet block carry the earlier look's interval forward."""
    per = _per_image(6000, change=0.0)
    prev = None
    for n in range(777, 6000, 777):
        prev = seq.look(per, POLICY, n, previous=prev)
    at_blocks = seq.look(per, POLICY, prev.images)
    for a, b in zip(prev.gates, at_blocks.gates, strict=True):
        assert a.lower >= b.lower - 1e-12 if a.lower is not None else b.lower is None
        assert a.status == b.status or a.status != GateStatus.INCONCLUSIVE


def test_unlabelled_data_skips_or_blocks_the_top1_gate():
    per = _per_image(20_000, labels=False)
    g = _gate(seq.look(per, POLICY), TOP1)
    assert g.status == GateStatus.PASS and g.missing == Missing.UNLABELLED
    strict = Policy.model_validate(
        {"quality": {"top1": {"require_labels": True}}, "confidence": POLICY.confidence}
    )
    early = seq.look(per, strict, 500)
    assert _gate(early, TOP1).status == GateStatus.INCONCLUSIVE
    # agreement is still open on evidence at 500 images: not stuck, keep going
    assert _gate(early, AGREEMENT).status == GateStatus.INCONCLUSIVE
    assert not seq.stuck(early) and seq.stop_reason(early, True, None) is None
    now = seq.look(per, strict)
    assert seq.stuck(now) and not seq.settled(now)
    assert seq.stop_reason(now, True, None) == StopReason.NO_EVIDENCE


def test_stop_reasons_in_order():
    per = _per_image(20_000, change=0.02)
    done = seq.look(per, POLICY)
    assert seq.stop_reason(done, False, 20_000) == StopReason.SETTLED
    early = seq.look(per, POLICY, 500)
    assert not early.settled
    assert seq.stop_reason(early, True, None) is None
    assert seq.stop_reason(early, True, 500) == StopReason.UPPER_BOUND
    assert seq.stop_reason(early, False, None) == StopReason.DATA_EXHAUSTED


def test_nonfinite_output_fails_at_once_and_stays_failed():
    per = _per_image(1000)
    first = seq.look(per, POLICY, 500)
    assert _gate(first, FINITE).status == GateStatus.PASS
    bad = seq.PerImage(top1=per.top1, labels=per.labels, kl=per.kl, nonfinite={"fp8": 1, "fp16": 0})
    failed = seq.look(bad, POLICY, 800, previous=first)
    g = _gate(failed, FINITE)
    assert g.status == GateStatus.FAIL and g.settled_at == 800 and g.estimate == 1.0
    later = seq.look(per, POLICY, 1000, previous=failed)
    assert _gate(later, FINITE).status == GateStatus.FAIL


def test_nonfinite_flags_per_image_say_where_the_gate_failed():
    per = _per_image(1000)
    flags = np.zeros(1000, bool)
    flags[[640, 900]] = True
    flagged = seq.PerImage(top1=per.top1, nonfinite={"fp8": flags, "fp16": np.zeros(1000, bool)})
    assert _gate(seq.look(flagged, POLICY, 600), FINITE).status == GateStatus.PASS
    g = _gate(seq.look(flagged, POLICY, 700), FINITE)
    assert (g.status, g.settled_at, g.estimate) == (GateStatus.FAIL, 641, 1.0)
    assert _gate(seq.look(flagged, POLICY), FINITE).estimate == 2.0


def test_kl_above_the_cap_blocks_a_pass_but_not_a_fail():
    per = _per_image(5000, kl_scale=0.002)
    assert _gate(seq.look(per, POLICY), KL_MEAN).status == GateStatus.PASS
    kl = per.kl[("fp32", "fp8")].copy()
    kl[10] = 3.0 * seq.KL_CAP
    spiked = seq.PerImage(top1=per.top1, labels=per.labels, kl={("fp32", "fp8"): kl})
    g = _gate(seq.look(spiked, POLICY), KL_MEAN)
    assert g.status == GateStatus.INCONCLUSIVE and g.above_cap == 1 and "cap" in g.skipped_reason
    high = seq.PerImage(top1=per.top1, kl={("fp32", "fp8"): np.full(5000, 2.0 * seq.KL_CAP)})
    assert _gate(seq.look(high, POLICY), KL_MEAN).status == GateStatus.FAIL


def test_kl_ignores_images_not_finite_in_both_engines():
    per = _per_image(1000)
    kl = per.kl[("fp32", "fp8")].copy()
    kl[:100] = np.nan
    g = _gate(seq.look(seq.PerImage(top1=per.top1, kl={("fp32", "fp8"): kl}), POLICY), KL_MEAN)
    assert g.images == 900


def test_an_image_with_a_non_finite_output_is_neither_correct_nor_in_agreement():
    labels = np.array([3, 3, 5, 7])
    fp32 = np.array([3, 3, 5, -1])  # fp32's last row was not finite
    fp8 = np.array([3, -1, 5, -1])  # FP8's second and last rows were not finite
    per = seq.PerImage(top1={"fp32": fp32, "fp16": fp32, "fp8": fp8}, labels=labels)
    now = seq.look(per, POLICY)
    assert _gate(now, AGREEMENT).estimate == pytest.approx(2 / 4)
    assert _gate(now, TOP1).estimate == pytest.approx(-1 / 4)


def test_per_image_arrays_must_line_up():
    with pytest.raises(ValueError, match="differ in length"):
        seq.PerImage(top1={"fp8": np.zeros(3, int)}, labels=np.zeros(4, int))
    with pytest.raises(ValueError, match="look at 5 images of 3"):
        seq.look(seq.PerImage(top1={"fp8": np.zeros(3, int)}), POLICY, 5)


def test_a_look_becomes_the_decisions_quality_gates():
    per = _per_image(20_000, change=0.02)
    section = seq.make_section(POLICY, 20_000, None, [seq.look(per, POLICY)])
    gates = list(sequential_gates.decision_gates(section, POLICY).values())
    assert [g.name for g in gates] == [TOP1, AGREEMENT, KL_MEAN]
    assert [g.status for g in gates] == [GateStatus.FAIL, GateStatus.PASS, GateStatus.PASS]
    top1 = gates[0]
    assert top1.low < top1.value < top1.high and top1.confidence == POLICY.confidence


def test_decide_takes_a_sequential_studys_gates_from_its_last_look():
    """The fixed-N gates of the same record would use intervals that do not hold after
    optional stopping; `decide` replaces them, and the report's meaning check agrees."""

    record = _sequential_record()
    last = {g.name: g for g in record.sequential.looks[-1].gates}
    decision = decide(record, POLICY, "builtin:default")
    by_name = {g.name: g for g in decision.gates}
    for name in (TOP1, AGREEMENT, KL_MEAN):
        assert (by_name[name].low, by_name[name].high) == (last[name].lower, last[name].upper)
        assert by_name[name].status == last[name].status
    assert decision.outcome == Outcome.NOT_SHIP and TOP1 in decision.failed
    assert check_meaning(record.model_copy(update={"decision": decision})) == []


def test_another_policy_is_held_against_the_last_interval_or_left_open():
    record = _sequential_record()
    last = {g.name: g for g in record.sequential.looks[-1].gates}
    # a 2-point margin: the top-1 change's last interval lies above -2 points only if its
    # lower bound does; the verdict follows the interval, not the look's own threshold
    loose = Policy.model_validate({"quality": {"top1": {"margin_points": 2.5}}})
    g = sequential_gates.decision_gates(record.sequential, loose)[TOP1]
    assert last[TOP1].lower > -0.025 and g.status == GateStatus.PASS
    other = Policy.model_validate({"confidence": 0.99})
    g = sequential_gates.decision_gates(record.sequential, other)[AGREEMENT]
    assert g.status == GateStatus.INCONCLUSIVE and g.missing == Missing.NOT_RECORDED


def test_random_weights_keep_the_quality_gates_open_whatever_the_looks():

    record = _sequential_record()
    record = record.model_copy(
        update={"model": record.model.model_copy(update={"random_weights": True})}
    )
    gates = {g.name: g for g in decide(record, POLICY, "builtin:default").gates}
    assert gates[TOP1].missing == Missing.RANDOM_WEIGHTS


def test_the_section_round_trips_in_a_study_record():
    per = _per_image(3000)
    looks = [seq.look(per, POLICY, 1000)]
    looks.append(seq.look(per, POLICY, 3000, previous=looks[0]))
    section = seq.make_section(POLICY, 1000, 50_000, looks, StopReason.DATA_EXHAUSTED)
    record = build_record().model_copy(update={"sequential": section})
    again = StudyRecord.model_validate_json(record.model_dump_json())
    assert again.sequential == section


# --- report ---------------------------------------------------------------------------------


def _sequential_record(n: int = 6000, round_size: int = 500) -> StudyRecord:
    per = _per_image(n, change=0.02)
    looks, prev = [], None
    for images in range(round_size, n + 1, round_size):
        prev = seq.look(per, POLICY, images, previous=prev)
        looks.append(prev)
    stop = StopReason.SETTLED if seq.settled(prev) else StopReason.DATA_EXHAUSTED
    section = seq.make_section(POLICY, round_size, 50_000, looks, stop)
    return build_record().model_copy(update={"sequential": section})


def test_the_report_shows_every_look_and_passes_its_self_check(tmp_path):

    record = _sequential_record()
    record = record.model_copy(update={"decision": decide(record, POLICY, "builtin:default")})
    md = render_markdown(record)
    assert check_markdown(md, record) == []
    # the decision's table says where its quality intervals come from
    assert "confidence sequences at the last look" in md and "Tango" not in md
    section = md[md.index("### Sequential decision") :]
    assert seq.SOURCE in section and f"{len(record.sequential.looks)} looks" in section
    assert section.count("\n| 3,000 |") == 1  # one row per look
    assert f"]({SEQUENTIAL_PNG})" in section
    written = {p.name for p in write_plots(record, tmp_path)}
    assert SEQUENTIAL_PNG in written
    assert (tmp_path / SEQUENTIAL_PNG).read_bytes()[:4] == b"\x89PNG"


def test_a_record_without_looks_renders_no_sequential_section():

    record = build_record()
    assert "Sequential decision" not in render_markdown(record)
    assert "sequential.png" not in {name for name, _ in available_plots(record)}
