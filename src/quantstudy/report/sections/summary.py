"""The title with its warning banners, and the summary: the decision in sentences, then its gates.

The sentences quote the record; a comparison they draw (the kernel hypothesis) decides the wording
only, its arithmetic is never printed.
"""

from __future__ import annotations

from quantstudy.record import BatchSpeed, KernelBreakdown, StudyRecord
from quantstudy.record.study import unsealed
from quantstudy.record.vocab import KernelGroup
from quantstudy.report.claims import NOT_MEASURED_X, claim_of
from quantstudy.report.format import (
    NOT_MEASURED,
    code,
    fmt_mib,
    fmt_ms,
    fmt_pct,
    fmt_points,
    fmt_ratio,
    fmt_sig,
    fmt_us,
    join_words,
)
from quantstudy.report.lookups import (
    ACT_ONLY,
    CPU_BANNER,
    FP8,
    FP16,
    RANDOM_WEIGHTS_BANNER,
    WEIGHT_ONLY,
    engine_quality,
    shipped,
    weight_bytes,
)
from quantstudy.report.sections.decision import (
    OUTCOME_WORDS,
    gate_table,
    redecided_sentence,
    summary_sentences,
)


def _timings_meaningless(r: StudyRecord) -> bool:
    return r.speed is not None and not r.speed.meaningful


def _gpu_words(r: StudyRecord) -> str:
    env = r.environment
    if env.gpu_name:
        return env.gpu_name
    return r.speed.device if r.speed is not None else r.config.device


def _breakdown(r: StudyRecord, engine: str, batch: int) -> KernelBreakdown | None:
    if r.speed is None:
        return None
    return next((k for k in r.speed.kernels if k.engine == engine and k.batch == batch), None)


def _group_us(k: KernelBreakdown, group: KernelGroup) -> float | None:
    g = next((g for g in k.groups if g.group == group), None)
    return None if g is None else g.time_us


def render_title(r: StudyRecord) -> list[str]:
    state = OUTCOME_WORDS[r.decision.outcome] if r.decision is not None else "not shipped"
    lines = [f"# FP8 quantization study ({state}): {r.model.name}", ""]
    banners = []
    if not r.config.quality:
        banners.append(
            "**Speed only** (`--no-quality`): no quality pass ran (no fp32 reference, no "
            "emulation, no held-out scoring), so no quality gate can pass and the decision is at "
            f"best inconclusive. Weights: {r.model.weights_detail}; the timings do not depend on "
            "their values."
        )
    if r.model.random_weights and r.config.quality:
        banners.append(
            f"**Warning: {RANDOM_WEIGHTS_BANNER}** ({r.model.weights_detail}). Top-1, "
            "agreement and KL below describe an untrained network, not a deployable model."
        )
    elif r.quality is not None and not r.quality.meaningful:
        banners.append(
            f"**Warning: quality numbers are not meaningful** "
            f"({r.quality.meaningless_reason or 'marked so by the study'})."
        )
    if _timings_meaningless(r):
        assert r.speed is not None
        words = CPU_BANNER if "cuda" not in r.speed.device.lower() else "timings are not meaningful"
        reason = r.speed.meaningless_reason or "marked so by the study"
        banners.append(
            f"**Warning: {words}** (device {r.speed.device}: {reason}). The speed gates cannot "
            "pass until the study runs on a GPU."
        )
    if r.status == "partial":
        absent = [
            name
            for name, section in (
                ("recipe", r.recipe),
                ("calibration", r.calibration),
                ("quality", r.quality),
                ("speed", r.speed),
                ("decision", r.decision),
            )
            if section is None
        ]
        banners.append(
            f"**Partial study** (status {r.status}): {NOT_MEASURED}: {join_words(absent)}."
            if absent
            else f"**Partial study** (status {r.status})."
        )
    if unsealed(r):
        banners.append(
            "**Unsealed record**: this study.json carries no digest, so its numbers cannot be "
            "checked against the study that measured them (`quantstudy decide` and `export` "
            "refuse it); rerun the study for a sealed record."
        )
    for b in banners:
        lines += [f"> {b}", ">"]
    if banners:
        lines[-1] = ""
    return lines


def _x_words(b: BatchSpeed) -> str:
    """x with its quartiles and the marks of its claim (`report/claims.py`)."""
    claim = claim_of(b)
    if not claim.measured:
        return NOT_MEASURED_X
    marks = "; " + ", ".join(claim.tags()) if claim.tags() else ""
    q1, q3 = fmt_ratio(b.ratio.q1), fmt_ratio(b.ratio.q3)
    return f"{fmt_ratio(b.ratio.median)} (q1 {q1}, q3 {q3}{marks})"


def _speed_sentence(r: StudyRecord) -> str:
    sp = r.speed
    if sp is None or not sp.batches:
        return f"Speed was {NOT_MEASURED}."
    per = "; ".join(
        f"batch {b.batch}: fp16 {fmt_ms(b.fp16_ms.median)} ms, FP8 {fmt_ms(b.fp8_ms.median)} ms, "
        f"x {_x_words(b)}"
        for b in sp.batches
    )
    lead = (
        f"Timings on {sp.device} are not evidence for a GPU engine; as measured, "
        if not sp.meaningful
        else f"On {_gpu_words(r)} at compile mode {sp.compile_mode}, "
    )
    return f"{lead}with x = fp16 ms / FP8 ms per round and medians over {sp.rounds} rounds: {per}."


def _size_sentence(r: StudyRecord) -> str:
    wb = weight_bytes(r)
    if FP16 not in wb or FP8 not in wb:
        return f"Weight bytes of the fp16 and FP8 engines: {NOT_MEASURED}."
    return (
        f"FP8 weights take {fmt_mib(wb[FP8])} MiB against {fmt_mib(wb[FP16])} MiB for fp16; "
        "weight bytes are reported, never a reason to ship on their own."
    )


def _quality_sentence(r: StudyRecord) -> str:
    q = r.quality
    eq = engine_quality(r, FP8)
    if q is None or eq is None:
        return f"Quality of the FP8 engine was {NOT_MEASURED}."
    lead = f"With random weights ({RANDOM_WEIGHTS_BANNER}), " if r.model.random_weights else ""
    s = (
        f"{lead}on {eq.n_images} held-out images the FP8 engine's top-1 agrees with "
        f"{q.reference} on {fmt_pct(eq.agreement)} ({eq.differ_count} of {eq.n_images} "
        "images differ)"
    )
    if eq.labelled and eq.top1 is not None and eq.top1_reference is not None:
        s += f"; top-1 is {fmt_pct(eq.top1)} against {fmt_pct(eq.top1_reference)} for {q.reference}"
        if eq.net_change is not None:
            s += (
                f", a net change of {eq.net_change:+d} correct predictions ({eq.gained} gained, "
                f"{eq.lost} lost"
            )
            if eq.wrong_to_wrong is not None:
                s += f", {eq.wrong_to_wrong} moved between two wrong classes"
            s += ")"
        if eq.top1_change is not None and eq.ci_low is not None and eq.ci_high is not None:
            s += (
                f", top-1 change {fmt_points(eq.top1_change)} points with bootstrap CI "
                f"[{fmt_points(eq.ci_low)}, {fmt_points(eq.ci_high)}]"
            )
        if eq.mcnemar_p is not None:
            s += f" and McNemar p = {fmt_sig(eq.mcnemar_p)}"
    elif not eq.labelled:
        s += "; the held-out set is unlabelled, so top-1 against labels was not measured"
    s += f"; mean KL({q.reference}, FP8) is {fmt_sig(eq.kl_mean)}."
    return s


def _attribution_sentence(r: StudyRecord) -> str:
    wo, ao = engine_quality(r, WEIGHT_ONLY), engine_quality(r, ACT_ONLY)
    if wo is None or ao is None:
        return (
            "Without both a weight-only and an activation-only run, this study does not "
            "attribute the quality change to weights or to activations."
        )
    return (
        f"Weight-only fake-quant agrees with fp32 on {fmt_pct(wo.agreement)} (KL mean "
        f"{fmt_sig(wo.kl_mean)}) and activation-only fake-quant on {fmt_pct(ao.agreement)} "
        f"(KL mean {fmt_sig(ao.kl_mean)}); these two runs are this study's only evidence on "
        "where the loss comes from."
    )


def _emulation_sentence(r: StudyRecord) -> str:
    gap = r.quality.emulation_gap if r.quality is not None else None
    if gap is None:
        return "The FP8 engine was not compared with its fake-quant emulation."
    return (
        f"The FP8 engine and its fake-quant emulation of the same recipe disagree on "
        f"{gap.differ_count} images (agreement {fmt_pct(gap.agreement)}, KL mean "
        f"{fmt_sig(gap.kl_mean)}): the comparison that tells the recipe's loss from the "
        "engine's."
    )


def _kernel_sentence(r: StudyRecord) -> str | None:
    """A hypothesis from the kernel groups, stated as one, when speed failed."""
    if r.speed is None or not r.speed.kernels or shipped(r):
        return None
    batches = sorted({k.batch for k in r.speed.kernels})
    for batch in reversed(batches):
        k16, k8 = _breakdown(r, FP16, batch), _breakdown(r, FP8, batch)
        if k16 is None or k8 is None:
            continue
        mm16 = _group_us(k16, KernelGroup.FP16_MATMUL_CONV)
        mm8 = _group_us(k8, KernelGroup.FP8_MATMUL)
        qc = _group_us(k8, KernelGroup.QUANTIZE_CONVERT)
        if mm16 is None or mm8 is None or qc is None:
            continue  # printed values must exist in the record
        rest16 = _group_us(k8, KernelGroup.FP16_MATMUL_CONV) or 0.0
        saved = mm16 - (mm8 + rest16)
        if saved <= 0:
            guess = (
                f"with the FP8 engine's remaining fp16 matrix products and convs "
                f"({fmt_us(rest16)} us), its matrix work takes at least as long as the fp16 "
                "engine's, so the FP8 products themselves do not save time at this batch; "
                "we have not measured why further"
            )
        elif qc >= saved:
            guess = (
                "this suggests that the quantize/convert work takes at least the time the FP8 "
                "products save, likely because the activation quantize does not fuse into its "
                "producer; we have not measured a build where it does"
            )
        else:
            guess = (
                "the FP8 products save more time than the quantize/convert kernels take, so the "
                "missing gain likely lies in the other kernel groups or launch overhead; we have "
                "not measured that further"
            )
        return (
            f"At batch {batch}, the profiler puts {fmt_us(mm8)} us of the FP8 engine's "
            f"{fmt_us(k8.total_us)} us in FP8 matrix products and {fmt_us(qc)} us in "
            f"quantize/convert kernels, against {fmt_us(mm16)} us of fp16 matrix products and "
            f"convs in the fp16 engine's {fmt_us(k16.total_us)} us; {guess}."
        )
    return None


def render_summary(r: StudyRecord) -> list[str]:
    lines = ["## Summary and decision", ""]
    d = r.decision
    if d is None:
        first = [
            f"No decision is recorded in this study (status {r.status}), so FP8 is not shipped."
        ]
    else:
        first = summary_sentences(d)
    sentences = [
        *first,
        _speed_sentence(r),
        _size_sentence(r),
        _quality_sentence(r),
        _attribution_sentence(r),
        _emulation_sentence(r),
    ]
    k = _kernel_sentence(r)
    if k:
        sentences.append(k)
    lines += [" ".join(x[0].upper() + x[1:] for x in sentences), ""]
    if d is not None:
        lines += gate_table(d, sequential=r.sequential is not None and bool(r.sequential.looks))
        lines += ["", f"Policy: {code(d.policy)}.", ""]
        again = redecided_sentence(d)
        if again:
            lines += [again, ""]
    return lines
