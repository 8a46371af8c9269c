"""The closing sections: warnings, other formats, what was not tried, and when to revisit.

They say what the record does not show; the gaps the study recorded come first, verbatim, and
what follows from the record is not repeated when the study already says it.
"""

from __future__ import annotations

from quantstudy.record import Gate, StudyRecord
from quantstudy.record.vocab import GateMetric, GateStatus, Missing
from quantstudy.report.format import code
from quantstudy.report.lookups import ACT_ONLY, WEIGHT_ONLY, engine_quality
from quantstudy.report.sections.decision import (
    MISSING_WORDS,
    interval_words,
    measured_words,
    settle_sentence,
    threshold_words,
)


def render_warnings(r: StudyRecord) -> list[str]:
    items = []
    if r.quality is not None:
        items += r.quality.warnings
        if not r.quality.meaningful and r.quality.meaningless_reason:
            items.append(f"quality not meaningful: {r.quality.meaningless_reason}")
    if r.speed is not None:
        items += [f"batch {b.batch}: {w}" for b in r.speed.batches for w in b.warnings]
        if not r.speed.meaningful and r.speed.meaningless_reason:
            items.append(f"timings not meaningful: {r.speed.meaningless_reason}")
    body = [f"- {w}" for w in items] or ["None recorded."]
    return ["## Warnings", "", *body, ""]


def _arch_words(capability: str | None) -> str | None:
    if not capability:
        return None
    major = capability.split(".")[0]
    if not major.isdigit():
        return None
    if int(major) >= 10:
        return "a Blackwell or later GPU"
    return {"7": "a Volta or Turing GPU", "8": "an Ampere or Ada GPU", "9": "a Hopper GPU"}.get(
        major
    )


def render_other_formats(r: StudyRecord) -> list[str]:
    env = r.environment
    if env.gpu_name:
        arch = _arch_words(env.gpu_capability)
        gpu = f"this study's GPU, the {env.gpu_name}"
        if env.gpu_capability:
            gpu += f" (compute capability {env.gpu_capability})"
        gpu += f", is {arch}" if arch else ""
    else:
        gpu = f"this study ran on {r.config.device}, without a GPU"
    return [
        "## Other formats",
        "",
        "- NVFP4: not tried. quantstudy has no NVFP4 path in this engine, and FP4 tensor cores "
        f"need a Blackwell GPU; {gpu}.",
        "- INT8: not tried. quantstudy has no INT8 path yet.",
        "",
        "These are statements about the tool, not measured results.",
        "",
    ]


def render_not_tried(r: StudyRecord) -> list[str]:
    lines = ["## What was not tried", ""]
    recorded = [f"- {x}" for x in r.not_run] or ["- (the study recorded no further gaps)"]
    lines += ["Recorded by the study:", "", *recorded, "", "Following from this record:", ""]
    derived = []
    stated = " ".join(r.not_run).lower()  # what the study already says is not repeated
    if "tensorrt" in stated:
        pass
    elif not any("tensorrt" in e.name.lower() or "trt" in e.name.lower() for e in r.engines):
        names = ", ".join(e.name for e in r.engines) or "none"
        derived.append(
            f"No TensorRT engine was built; the engines here ({names}) are PyTorch modules, "
            "compiled with torch.compile where marked."
        )
    if "quantization-aware" not in stated:
        derived.append(
            "No quantization-aware training: quantstudy does post-training quantization."
        )
    if r.sensitivity is None and r.layer_speed is None:
        if "sensitivity" not in stated:
            derived.append(
                "Per-layer sensitivity (KL with one layer quantized) and per-layer speed gain "
                "are not part of this record."
            )
    elif r.sensitivity is None:
        derived.append("Per-layer sensitivity (KL with one layer quantized) is not recorded.")
    elif r.layer_speed is None:
        derived.append("Per-layer speed gain is not part of this record.")
    elif r.layer_speed.source == "file":
        derived.append(
            "Per-layer speed gains were not measured by this study: they were read from a file."
        )
    if r.speed is None:
        derived.append("No timing at all: the study has no speed section.")
    else:
        if not r.speed.meaningful and "gpu timing" not in stated:
            derived.append(f"No GPU timing: timings were taken on {r.speed.device}.")
        derived.append(
            "Timed batches: " + ", ".join(str(b.batch) for b in r.speed.batches) + "; no other."
        )
        if not r.speed.kernels:
            derived.append("No profiler kernel breakdown.")
        if not r.speed.package_bytes and "package size" not in stated:
            derived.append("No compiled package size.")
    if r.calibration is not None:
        derived.append(
            f"Only the {code(r.calibration.calibrator)} calibrator was run for the main recipe."
        )
    if engine_quality(r, WEIGHT_ONLY) is None or engine_quality(r, ACT_ONLY) is None:
        derived.append("No weight-only and activation-only runs: the loss is not attributed.")
    if not r.variants:
        derived.append("No recipe variant.")
    if not r.data.labelled:
        derived.append("No accuracy against labels: the data is unlabelled.")
    lines += [f"- {x}" for x in derived]
    return [*lines, ""]


def _gate_line(g: Gate) -> str:
    """One gate with its numbers: what it measured and what it needs."""
    if g.metric is None:
        return f"{g.name}: {g.measured}; needs {g.threshold_text}"
    interval = f" {interval_words(g)}" if g.low is not None else ""
    measured = (
        measured_words(g)
        if g.value is not None
        else (MISSING_WORDS.get(g.missing, "-") if g.missing is not None else "-")
    )
    return f"{g.name}: {measured}{interval}; needs {threshold_words(g)}"


_QUALITY_LEADS = {
    GateMetric.AGREEMENT: "Quality: when a calibration or layer choice keeps top-1 agreement "
    "within the threshold.",
    GateMetric.KL_MEAN: "Quality: when a calibration or layer choice keeps the mean KL within "
    "the threshold.",
    GateMetric.TOP1_CHANGE: "Quality: when fewer FP8 layers or another calibrator keep the "
    "top-1 change above the threshold (not measured here).",
    GateMetric.NONFINITE: "Quality: when no engine produces a non-finite logit.",
}


def render_revisit(r: StudyRecord) -> list[str]:
    """What would change the decision, grouped by the gates' status and missing evidence."""
    lines = ["## When to revisit", ""]
    d = r.decision
    if d is None:
        return [
            *lines,
            "When the study is complete: no decision is recorded, so nothing here can ship.",
            "",
        ]
    if d.ship:
        return [
            *lines,
            "FP8 shipped under this policy. Re-run the study when the GPU, driver, torch, model "
            "or recipe changes: every gate was measured for this combination only.",
            "",
        ]

    open_ = [g for g in d.gates if not g.passed]
    return [*lines, *_missing_lines(open_), *_evaluated_lines(open_), ""]


def _detailed(lead: str, gs: list[Gate], verb: str = "Failed") -> list[str]:
    """A lead, then each gate on its own line."""
    return [f"- {lead} {verb} here:", *(f"  - {_gate_line(g)}." for g in gs)]


def _shared(lead: str, gs: list[Gate]) -> list[str]:
    """A lead shared by the gates it names."""
    return [f"- {lead} For: {', '.join(g.name for g in gs)}."]


def _missing_lines(open_: list[Gate]) -> list[str]:
    """The open gates that lack evidence, by what is missing."""
    lines: list[str] = []
    by_missing = {m: [g for g in open_ if g.missing == m] for m in Missing}
    off_gpu = by_missing[Missing.NOT_ON_GPU]
    if off_gpu:
        lines += _shared(
            "Run the study on a GPU: the speed gates cannot pass without GPU timings "
            f"({off_gpu[0].skipped_reason}).",
            off_gpu,
        )
    if by_missing[Missing.RANDOM_WEIGHTS]:
        lines += _shared(
            "With pretrained weights: quality measured on random weights is not evidence.",
            by_missing[Missing.RANDOM_WEIGHTS],
        )
    if by_missing[Missing.NOT_RECORDED]:
        lines += _detailed(
            "Re-run the study with this version: the record predates numbers these gates need.",
            by_missing[Missing.NOT_RECORDED],
            "Open",
        )
    unmeasured = [
        g
        for m in (
            Missing.NOT_MEASURED,
            Missing.NOT_TIMED,
            Missing.NOT_MEANINGFUL,
            Missing.UNLABELLED,
        )
        for g in by_missing[m]
    ]
    if unmeasured:
        lines += _detailed("When the missing measurements exist.", unmeasured, "Open")
    return lines


def _evaluated_lines(open_: list[Gate]) -> list[str]:
    """The open gates whose evidence exists: what would move each."""
    lines: list[str] = []
    evaluated = [g for g in open_ if g.missing is None]
    speed_fail = [g for g in evaluated if g.kind == "speed" and g.status == GateStatus.FAIL]
    if speed_fail:
        lines += _detailed(
            "Speed: when an FP8 matrix-product kernel (1x1 convolution or linear) is faster "
            "than fp16 at these shapes and the activation quantize fuses into its producer.",
            speed_fail,
        )
    speed_open = [g for g in evaluated if g.kind == "speed" and g.status != GateStatus.FAIL]
    if speed_open:
        lines += _detailed(
            "Speed: the timing rounds straddle the threshold; more rounds on a quieter GPU "
            "would settle it, or a faster FP8 kernel would move it.",
            speed_open,
            "Open",
        )
    needs_images = [g for g in evaluated if g.kind == "quality" and g.images_needed is not None]
    for g in needs_images:
        lines += [
            f"- With a larger labelled held-out set: {settle_sentence(g)}.",
            f"  - {_gate_line(g)}.",
        ]
    for g in evaluated:
        if g.kind == "quality" and g not in needs_images:
            lead = (
                _QUALITY_LEADS.get(g.metric, f"When {g.name} passes.")
                if g.metric
                else (f"When {g.name} passes.")
            )
            lines += _detailed(lead, [g], "Failed" if g.status == GateStatus.FAIL else "Open")
    return lines
