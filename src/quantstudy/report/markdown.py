"""Render a `StudyRecord` as the study's Markdown section, in the seeds' structure.

`render_markdown(record)` is a pure function of the record: same record, same bytes. It reads
nothing else (no clock, no files), so `quantstudy report STUDY_DIR` can re-render at any time.

Every number printed is a value of the record passed through one of the formatters below
(`FORMATTERS`); `report/selfcheck.py` applies the same formatters to every numeric leaf of the
record to verify that each number in the Markdown comes from it. So: no arithmetic on record
values here (no differences, ratios or sums printed), and no number typed into the prose.
Strings of the record (gate thresholds, warnings, versions, names) are printed verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np

from quantstudy.decision.policy import (
    AGREEMENT,
    FINITE,
    KL_MEAN,
    NOT_ON_GPU,
    RANDOM_WEIGHTS,
    SPEED_MARGIN,
    SPEED_SPREAD,
    TOP1_CI,
)
from quantstudy.report.plots import KERNELS_PNG, KL_PNG, LATENCY_PNG, available_plots
from quantstudy.study.schema import (
    BatchSpeed,
    EngineInfo,
    EngineQuality,
    Gate,
    KernelBreakdown,
    LayerDecision,
    StudyRecord,
    TimingStats,
)

FP32, FP16, FP8 = "fp32", "fp16", "fp8"
FAKEQUANT, WEIGHT_ONLY, ACT_ONLY = "fakequant", "fakequant_weights", "fakequant_activations"
ENGINE_LABELS = {
    FP32: "fp32 (reference)",
    FP16: "fp16",
    FP8: "FP8",
    FAKEQUANT: "fake-quant (FP8 emulation)",
    WEIGHT_ONLY: "weight-only fake-quant",
    ACT_ONLY: "activation-only fake-quant",
}
KERNEL_GROUPS = ("fp8_matmul", "fp16_matmul_conv", "depthwise_conv", "quantize_convert", "other")
COLLAPSE_ROWS = 12  # tables longer than this go into <details>
NOT_MEASURED = "not measured"
RANDOM_WEIGHTS_BANNER = "quality numbers are meaningless: random weights"
CPU_BANNER = "timings on CPU are not meaningful"


# --- formatters: the only way a number reaches the Markdown --------------------------------


def fmt_plain(v: float) -> str:
    """The value as the record holds it: integers exactly, floats by their shortest repr."""
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def fmt_ms(v: float) -> str:
    """Milliseconds, 3 decimals."""
    return f"{v:.3f}"


def fmt_us(v: float) -> str:
    """Microseconds, 1 decimal."""
    return f"{v:.1f}"


def fmt_ratio(v: float) -> str:
    """Ratios (x = fp16 ms / FP8 ms), 2 decimals."""
    return f"{v:.2f}"


def fmt_pct(v: float) -> str:
    """A fraction as a percentage, 2 decimals: 0.8153 -> 81.53%."""
    return f"{100 * v:.2f}%"


def fmt_points(v: float) -> str:
    """A difference of fractions in percentage points, signed, 2 decimals: -0.0013 -> -0.13."""
    return f"{100 * v:+.2f}"


def fmt_sig(v: float) -> str:
    """Small quantities (KL, p-values, scales): 3 significant digits, never in e-notation."""
    return np.format_float_positional(v, precision=3, unique=False, fractional=False, trim="-")


def fmt_mib(v: float) -> str:
    """Bytes as MiB, 2 decimals."""
    return f"{v / 1048576:.2f}"


FORMATTERS: tuple[Callable[[float], str], ...] = (
    fmt_plain,
    fmt_ms,
    fmt_us,
    fmt_ratio,
    fmt_pct,
    fmt_points,
    fmt_sig,
    fmt_mib,
)


# --- Markdown helpers ----------------------------------------------------------------------


def _cell(s: object) -> str:
    return str(s).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(s: str) -> str:
    s = str(s).replace("\n", " ")
    if "`" in s:
        return f"`` {s} ``"
    return f"`{s}`"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    rows = list(rows)
    for row in rows:
        assert len(row) == len(header), (header, row)
    out = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    out.append("|" + "|".join(" --- " for _ in header) + "|")
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _maybe_collapsed(summary: str, lines: list[str], n_rows: int) -> list[str]:
    if n_rows <= COLLAPSE_ROWS:
        return [*lines, ""]
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def _fence(text: str, lang: str = "text") -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + lang, *text.splitlines(), fence]


def _label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def _spread(t: TimingStats, fmt: Callable[[float], str]) -> str:
    return f"{fmt(t.median)} [{fmt(t.q1)}, {fmt(t.q3)}]"


def _opt(v: float | int | None, fmt: Callable[[float], str], missing: str = NOT_MEASURED) -> str:
    return missing if v is None else fmt(v)


def _hw(v: tuple[int, int] | None) -> str:
    return "n/a" if v is None else f"{v[0]} x {v[1]}"


def _join(items: list[str]) -> str:
    if not items:
        return "none"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


# --- record lookups ------------------------------------------------------------------------


def _shipped(r: StudyRecord) -> bool:
    return r.decision is not None and r.decision.ship


def _engine_info(r: StudyRecord, name: str) -> EngineInfo | None:
    return next((e for e in r.engines if e.name == name), None)


def _engine_quality(r: StudyRecord, name: str) -> EngineQuality | None:
    if r.quality is None:
        return None
    return next((e for e in r.quality.engines if e.engine == name), None)


def _weight_bytes(r: StudyRecord) -> dict[str, int]:
    if r.speed is not None and r.speed.weight_bytes:
        return dict(r.speed.weight_bytes)
    return {e.name: e.weight_bytes for e in r.engines}


def _random(r: StudyRecord) -> bool:
    return r.model.random_weights or (r.quality is not None and not r.quality.meaningful)


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


def _group_us(k: KernelBreakdown, group: str) -> float | None:
    g = next((g for g in k.groups if g.group == group), None)
    return None if g is None else g.time_us


# --- sections ------------------------------------------------------------------------------


def _title(r: StudyRecord) -> list[str]:
    state = "shipped" if _shipped(r) else "not shipped"
    lines = [f"# FP8 quantization study ({state}): {r.model.name}", ""]
    banners = []
    if r.model.random_weights:
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
            f"**Warning: {words}** (device {r.speed.device}: {reason}). The speed gates fail "
            "until the study runs on a GPU."
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
            f"**Partial study** (status {r.status}): {NOT_MEASURED}: {_join(absent)}."
            if absent
            else f"**Partial study** (status {r.status})."
        )
    for b in banners:
        lines += [f"> {b}", ">"]
    if banners:
        lines[-1] = ""
    return lines


def _speed_sentence(r: StudyRecord) -> str:
    sp = r.speed
    if sp is None or not sp.batches:
        return f"Speed was {NOT_MEASURED}."
    per = "; ".join(
        f"batch {b.batch}: fp16 {fmt_ms(b.fp16_ms.median)} ms, FP8 {fmt_ms(b.fp8_ms.median)} ms, "
        f"x {fmt_ratio(b.ratio.median)} (q1 {fmt_ratio(b.ratio.q1)}, q3 {fmt_ratio(b.ratio.q3)})"
        for b in sp.batches
    )
    lead = (
        f"Timings on {sp.device} are not evidence for a GPU engine; as measured, "
        if not sp.meaningful
        else f"On {_gpu_words(r)} at compile mode {sp.compile_mode}, "
    )
    return f"{lead}with x = fp16 ms / FP8 ms per round and medians over {sp.rounds} rounds: {per}."


def _size_sentence(r: StudyRecord) -> str:
    wb = _weight_bytes(r)
    if FP16 not in wb or FP8 not in wb:
        return f"Weight bytes of the fp16 and FP8 engines: {NOT_MEASURED}."
    return (
        f"FP8 weights take {fmt_mib(wb[FP8])} MiB against {fmt_mib(wb[FP16])} MiB for fp16; "
        "weight bytes are reported, never a reason to ship on their own."
    )


def _quality_sentence(r: StudyRecord) -> str:
    q = r.quality
    eq = _engine_quality(r, FP8)
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
    wo, ao = _engine_quality(r, WEIGHT_ONLY), _engine_quality(r, ACT_ONLY)
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
    if r.speed is None or not r.speed.kernels or _shipped(r):
        return None
    batches = sorted({k.batch for k in r.speed.kernels})
    for batch in reversed(batches):
        k16, k8 = _breakdown(r, FP16, batch), _breakdown(r, FP8, batch)
        if k16 is None or k8 is None:
            continue
        mm16 = _group_us(k16, "fp16_matmul_conv")
        mm8 = _group_us(k8, "fp8_matmul")
        qc = _group_us(k8, "quantize_convert")
        if mm16 is None or mm8 is None or qc is None:
            continue  # printed values must exist in the record
        rest16 = _group_us(k8, "fp16_matmul_conv") or 0.0  # compared, never printed
        saved = mm16 - (mm8 + rest16)
        if qc >= saved:
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


def _gate_result(g: Gate) -> str:
    if g.skipped_reason:
        return f"skipped: {g.skipped_reason}"
    return "pass" if g.passed else "**fail**"


def _summary(r: StudyRecord) -> list[str]:
    lines = ["## Summary and decision", ""]
    d = r.decision
    if d is None:
        first = f"No decision is recorded in this study (status {r.status}), so FP8 is not shipped."
    else:
        first = d.summary
    sentences = [
        first,
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
        lines += _table(
            ["Gate", "Kind", "Threshold", "Measured", "Result"],
            [[g.name, g.kind, g.threshold, g.measured, _gate_result(g)] for g in d.gates],
        )
        lines += ["", f"Policy: {_code(d.policy)}.", ""]
    return lines


def _layer_rows(
    layers: list[LayerDecision], real: set[str], emulated: set[str], other: str
) -> list[list[str]]:
    rows = []
    for x in layers:
        runs = "FP8" if x.name in real else "emulated" if x.name in emulated else other
        rows.append(
            [
                _code(x.name),
                x.op,
                _hw(x.kernel),
                _hw(x.stride),
                str(x.groups),
                str(x.in_channels),
                str(x.out_channels),
                _hw(x.input_hw),
                "none (default off)" if x.rule is None else str(x.rule),
                runs,
                x.reason,
            ]
        )
    return rows


def _recipe(r: StudyRecord) -> list[str]:
    lines = ["## Recipe", ""]
    rc = r.recipe
    if rc is None:
        return [*lines, f"Recipe: {NOT_MEASURED} (no recipe section in the study).", ""]
    params = ", ".join(f"{k} {fmt_plain(v)}" for k, v in rc.calibrator_params.items()) or "none"
    lines += [
        f"Recipe {_code(rc.name)} from {_code(rc.source)} (sha256 {_code(rc.sha256)}): "
        f"{rc.description}",
        "",
        f"- Format: {_code(rc.format)}; weight scales: {rc.weight_granularity.replace('_', '-')} "
        f"of the {'BatchNorm-folded' if rc.fold_bn else 'unfolded'} weights; activations: "
        f"static per-tensor scales from the {_code(rc.calibrator)} calibrator (parameters: "
        f"{params}).",
    ]
    fp8 = _engine_info(r, FP8)
    if fp8 is None:
        lines.append(f"- FP8 engine: {NOT_MEASURED} (no fp8 engine in the study).")
        real: set[str] = set()
        emulated: set[str] = set()
        other = "no FP8 engine"
    else:
        other = fp8.compute_dtype
        real, emulated = set(fp8.fp8_real), set(fp8.fp8_emulated)
        lines.append(
            f"- Ran FP8 for real (FP8 matrix products): {len(fp8.fp8_real)} of "
            f"{len(rc.selected)} selected layers."
        )
        emu = (
            f"- Emulated (quantize-dequantize, no FP8 kernel): {len(fp8.fp8_emulated)} of "
            f"{len(rc.selected)} selected layers"
        )
        if 0 < len(fp8.fp8_emulated) <= COLLAPSE_ROWS:
            emu += ": " + ", ".join(_code(n) for n in fp8.fp8_emulated)
        lines.append(emu + ".")
        lines.append(
            f"- Stayed in {fp8.compute_dtype}: {fp8.fp16_layers} conv/linear layers of the FP8 "
            "engine."
        )
    lines.append("")
    if rc.counts:
        lines += _table(["Layer class", "Layers"], [[k, str(v)] for k, v in rc.counts.items()])
        lines.append("")
    header = [
        "Layer",
        "Op",
        "Kernel",
        "Stride",
        "Groups",
        "In",
        "Out",
        "Input map",
        "Rule",
        "Runs as",
        "Reason",
    ]
    sel = _table(header, _layer_rows(rc.selected, real, emulated, other))
    lines += [f"Selected layers ({len(rc.selected)}):", ""]
    lines += _maybe_collapsed(f"{len(rc.selected)} selected layers", sel, len(rc.selected))
    exc = _table(header, _layer_rows(rc.excluded, set(), set(), other))
    lines += [f"Excluded candidates ({len(rc.excluded)}), each with its rule and reason:", ""]
    lines += _maybe_collapsed(f"{len(rc.excluded)} excluded candidates", exc, len(rc.excluded))
    return lines


def _method(r: StudyRecord) -> list[str]:
    lines = ["## Method", ""]
    for part in (
        _method_environment,
        _method_model,
        _method_data,
        _method_preprocessing,
        _method_calibration,
        _method_timing,
        _method_quality,
    ):
        lines += [*part(r), ""]
    return lines


def _method_environment(r: StudyRecord) -> list[str]:
    env = r.environment
    lines = ["### Environment", ""]
    if env.gpu_name:
        gpu = f"{env.gpu_name} (compute capability {env.gpu_capability or 'unknown'}, driver "
        gpu += f"{env.gpu_driver or 'unknown'})"
    else:
        gpu = "none (no GPU in this study)"
    rows = [
        ["GPU", gpu],
        ["CUDA, cuDNN", f"{env.cuda or 'none'}, {env.cudnn or 'none'}"],
        ["torch, timm, numpy", f"{env.torch}, {env.timm}, {env.numpy}"],
        ["Python", env.python],
        ["Platform", env.platform],
        ["CPU", f"{env.cpu} ({env.cpu_count} cores, {env.torch_threads} torch threads)"],
        ["quantstudy", f"{env.quantstudy} (commit {env.git_commit or 'unknown'})"],
        ["Created (UTC)", env.created_utc],
    ]
    lines += _table(["Item", "Value"], rows)
    c = r.config
    lines += ["", "Study configuration as recorded:", ""]
    lines += _table(
        ["Setting", "Value"],
        [
            ["model", c.model],
            ["weights", c.weights],
            ["data", c.data],
            ["calibration data", c.calib_data or "same folder as data"],
            ["recipe", c.recipe],
            ["calibration images", str(c.calib)],
            ["held-out images", str(c.heldout)],
            ["seed", str(c.seed)],
            ["device", c.device],
            ["batches", ", ".join(str(b) for b in c.batches)],
            ["compile mode", c.compile_mode],
            ["test-size settings", "yes" if c.test_settings else "no"],
            ["policy", c.policy],
        ],
    )

    return lines


def _method_model(r: StudyRecord) -> list[str]:
    m = r.model
    lines = ["### Model and engines", ""]
    tag = f", pretrained tag {_code(m.pretrained_tag)}" if m.pretrained_tag else ""
    sha = f", sha256 {_code(m.weights_sha256)}" if m.weights_sha256 else ""
    lines += [
        f"Model {_code(m.name)} (architecture {_code(m.architecture)}{tag}), {m.num_params} "
        f"parameters, {m.num_classes} classes, seed {m.seed}. Weights: {m.weights}, "
        f"{m.weights_detail}{sha}.",
        "",
    ]
    if r.engines:
        rows = [
            [
                _label(e.name),
                e.compute_dtype,
                e.device,
                "yes" if e.compiled else "no",
                e.compile_mode or "none",
                "yes" if e.cuda_graphs else "no",
                "yes" if e.channels_last else "no",
                str(len(e.fp8_real)),
                str(len(e.fp8_emulated)),
                str(e.fp16_layers),
                ", ".join(f"{k}={v}" for k, v in e.numerics.items()) or "none",
            ]
            for e in r.engines
        ]
        lines += _table(
            [
                "Engine",
                "Compute dtype",
                "Device",
                "Compiled",
                "Compile mode",
                "CUDA graphs",
                "channels_last",
                "FP8 real",
                "FP8 emulated",
                "Other conv/linear",
                "Numerics",
            ],
            rows,
        )
    else:
        lines.append(f"Engines: {NOT_MEASURED}.")

    return lines


def _method_data(r: StudyRecord) -> list[str]:
    data = r.data
    lines = ["### Data", ""]
    lines += [
        f"Data folder {_code(data.data_dir)}, calibration folder "
        f"{_code(data.calib_dir) if data.calib_dir else 'the same'}, class list "
        f"{_code(data.class_list) if data.class_list else 'none'}, labelled: "
        f"{'yes' if data.labelled else 'no'}, split seed {data.seed}.",
        "",
    ]
    sets = [data.calibration, data.heldout]
    lines += _table(
        [
            "Set",
            "Folder",
            "Labelled",
            "Images",
            "Classes",
            "Per class min",
            "Per class max",
            "ids sha256",
        ],
        [
            [
                s.role,
                _code(s.folder),
                "yes" if s.labelled else "no",
                str(s.n_images),
                _opt(s.n_classes, str, "unlabelled"),
                _opt(s.per_class_min, str, "unlabelled"),
                _opt(s.per_class_max, str, "unlabelled"),
                _code(s.ids_sha256),
            ]
            for s in sets
        ],
    )
    lines.append("")
    for s in sets:
        if s.per_class_min is not None and s.per_class_max is not None and s.n_classes:
            balance = (
                "class-balanced" if s.per_class_min == s.per_class_max else "not class-balanced"
            )
            lines.append(
                f"- {s.role.capitalize()} set: images per class min {s.per_class_min}, max "
                f"{s.per_class_max}, over {s.n_classes} classes: {balance}."
            )
    lines.append(f"- Images skipped while scanning: {len(data.skipped)}.")
    lines.append("")
    if data.skipped:
        sk = _table(["Image", "Reason"], [[_code(x.id), x.reason] for x in data.skipped])
        lines += _maybe_collapsed(f"{len(data.skipped)} skipped images", sk, len(data.skipped))

    return lines


def _method_preprocessing(r: StudyRecord) -> list[str]:
    pre = r.preprocessing
    lines = ["### Preprocessing", ""]
    size = " x ".join(str(v) for v in pre.input_size)
    lines += [
        f"- Input {size} (channels x height x width), crop_pct {fmt_plain(pre.crop_pct)}, crop "
        f"mode {pre.crop_mode}, interpolation {pre.interpolation}.",
        f"- Normalisation mean ({', '.join(fmt_plain(v) for v in pre.mean)}), std "
        f"({', '.join(fmt_plain(v) for v in pre.std)}).",
        f"- The pretrained config's {pre.settings} settings were used; source: {pre.source}.",
        "",
    ]

    return lines


def _method_calibration(r: StudyRecord) -> list[str]:
    lines = ["### Calibration", ""]
    cal = r.calibration
    if cal is None:
        lines += [f"Calibration: {NOT_MEASURED}.", ""]
    else:
        params = ", ".join(f"{k} {fmt_plain(v)}" for k, v in cal.params.items()) or "none"
        shared = [t for t in cal.tensors if len(t.consumers) > 1]
        lines.append(
            f"Calibrator {_code(cal.calibrator)} (parameters: {params}) on {cal.n_images} "
            f"calibration images: {len(cal.tensors)} activation tensors, one static per-tensor "
            "scale each."
        )
        if shared:
            lines.append(
                "Shared scales (one quantizer for several FP8 consumers): "
                + "; ".join(
                    f"{_code(t.tensor)} feeds {len(t.consumers)} layers "
                    f"({', '.join(_code(x) for x in t.consumers)})"
                    for t in shared
                )
                + "."
            )
        else:
            lines.append("Shared scales: none; every tensor has a single FP8 consumer.")
        lines.append("")
        tt = _table(
            ["Tensor", "Consumers", "amax", "scale"],
            [
                [_code(t.tensor), ", ".join(t.consumers), fmt_sig(t.amax), fmt_sig(t.scale)]
                for t in cal.tensors
            ],
        )
        lines += _maybe_collapsed(f"{len(cal.tensors)} activation scales", tt, len(cal.tensors))

    return lines


def _method_timing(r: StudyRecord) -> list[str]:
    lines = ["### Timing", ""]
    sp = r.speed
    if sp is None:
        lines += [f"Timing: {NOT_MEASURED}.", ""]
    else:
        clocks = ", ".join(f"{k} {v}" for k, v in sp.clocks.items()) or "not recorded"
        lines += [
            f"On {sp.device}, compile mode {sp.compile_mode}, fp16 and FP8 rounds interleaved: "
            f"rounds {sp.rounds}, calls per round {sp.iters_per_round}, warm-up calls "
            f"{sp.warmup}, input buffers {sp.input_buffers}; clocks: {clocks}. x is "
            "fp16 time / FP8 time of one round pair; tables give the median over rounds and "
            "[q1, q3], the first and third quartiles.",
            "",
            "The timed region, verbatim from the study:",
            "",
            *_fence(sp.timed_region),
            "",
        ]

    return lines


def _method_quality(r: StudyRecord) -> list[str]:
    lines = ["### Quality method", ""]
    q = r.quality
    if q is None:
        lines += [f"Quality: {NOT_MEASURED}.", ""]
    else:
        eq8 = _engine_quality(r, FP8)
        boot = ""
        if eq8 is not None and eq8.bootstrap_resamples is not None:
            boot = (
                f" The top-1 change CI is a paired bootstrap over images ({eq8.bootstrap_resamples}"
                f" resamples, seed {eq8.bootstrap_seed}); McNemar's test uses the discordant "
                "pairs (gained, lost)."
            )
        lines += [
            f"Every engine is compared with the {q.reference} reference on the same held-out "
            "images: top-1 and top-5 against labels where labelled, top-1 agreement with the "
            "reference (and the count of images that differ), the net change in correct "
            f"predictions split into gained and lost, and KL({q.reference}, engine) per "
            f"image.{boot} The NaN/Inf scan runs every held-out image and {len(q.stress_inputs)} "
            f"stress inputs: {', '.join(q.stress_inputs) or 'none'}.",
            "",
        ]
    return lines


def _speed_results(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Speed and size", ""]
    sp = r.speed
    wb = _weight_bytes(r)
    if sp is None or not sp.batches:
        lines += [f"Speed: {NOT_MEASURED}.", ""]
    else:
        if not sp.meaningful:
            words = CPU_BANNER if "cuda" not in sp.device.lower() else "timings are not meaningful"
            lines += [f"**Warning: {words}** ({sp.meaningless_reason or sp.device}).", ""]
        w16 = fmt_mib(wb[FP16]) if FP16 in wb else NOT_MEASURED
        w8 = fmt_mib(wb[FP8]) if FP8 in wb else NOT_MEASURED
        lines += _table(
            [
                "Batch",
                "fp16 ms median [q1, q3]",
                "FP8 ms median [q1, q3]",
                "x median [q1, q3]",
                "Rounds",
                "fp16 weights MiB",
                "FP8 weights MiB",
            ],
            [
                [
                    str(b.batch),
                    _spread(b.fp16_ms, fmt_ms),
                    _spread(b.fp8_ms, fmt_ms),
                    _spread(b.ratio, fmt_ratio),
                    str(b.ratio.n),
                    w16,
                    w8,
                ]
                for b in sp.batches
            ],
        )
        lines.append("")
        if LATENCY_PNG in plots:
            lines += [f"![Latency per batch, fp16 and FP8, with q1 to q3]({LATENCY_PNG})", ""]
        warn = [(b.batch, w) for b in sp.batches for w in b.warnings]
        for batch, w in warn:
            lines.append(f"- Batch {batch}: {w}")
        if warn:
            lines.append("")
    if wb:
        lines += _table(
            ["Engine", "Weight bytes", "MiB"],
            [[_label(k), str(v), fmt_mib(v)] for k, v in wb.items()],
        )
        lines.append("")
    if sp is not None and sp.package_bytes:
        lines += _table(
            ["Engine", "Compiled package bytes", "MiB"],
            [[_label(k), str(v), fmt_mib(v)] for k, v in sp.package_bytes.items()],
        )
        lines.append("")
    else:
        lines += ["Compiled package size: not measured.", ""]
    return lines


def _quality_row(e: EngineQuality) -> list[str]:
    nl = "no labels"
    change = nl
    if e.labelled:
        change = _opt(e.top1_change, fmt_points)
        if e.ci_low is not None and e.ci_high is not None:
            change += f" [{fmt_points(e.ci_low)}, {fmt_points(e.ci_high)}]"
    return [
        _label(e.engine),
        _opt(e.top1, fmt_pct) if e.labelled else nl,
        _opt(e.top5, fmt_pct) if e.labelled else nl,
        fmt_pct(e.agreement),
        str(e.differ_count),
        _opt(e.gained, str) if e.labelled else nl,
        _opt(e.lost, str) if e.labelled else nl,
        _opt(e.net_change, lambda v: f"{v:+d}") if e.labelled else nl,
        change,
        _opt(e.mcnemar_p, fmt_sig) if e.labelled else nl,
        fmt_sig(e.kl_mean),
        fmt_sig(e.kl_median),
        fmt_sig(e.kl_p99),
        fmt_sig(e.kl_max),
    ]


QUALITY_HEADER = [
    "Engine",
    "Top-1",
    "Top-5",
    "Agreement",
    "Differ",
    "Gained",
    "Lost",
    "Net",
    "Top-1 change, points [CI]",
    "McNemar p",
    "KL mean",
    "KL median",
    "KL p99",
    "KL max",
]


def _quality_results(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Quality", ""]
    q = r.quality
    if q is None:
        return [*lines, f"Quality: {NOT_MEASURED}.", ""]
    if _random(r):
        words = RANDOM_WEIGHTS_BANNER if r.model.random_weights else "quality is not meaningful"
        lines += [f"**Warning: {words}.**", ""]
    first = next((e for e in q.engines), None)
    n = f"{first.n_images} held-out images" if first else "the held-out images"
    balance = ""
    if q.n_classes is not None and q.per_class_min is not None and q.per_class_max is not None:
        balance = (
            f" over {q.n_classes} classes (images per class: min {q.per_class_min}, max "
            f"{q.per_class_max})"
        )
    lines += [
        f"Against {q.reference}, on {n}{balance}. Agreement is top-1 agreement with "
        f"{q.reference}; Differ counts the images whose top-1 differs from {q.reference}. "
        "Gained and lost count images the engine gets right where the reference is wrong and "
        "the reverse; Net is their difference; the two can be small while many predictions "
        "differ.",
        "",
    ]
    rows = []
    ref = next((e for e in q.engines if e.top1_reference is not None), None)
    if ref is not None and not any(e.engine == q.reference for e in q.engines):
        rows.append(
            [_label(q.reference), fmt_pct(ref.top1_reference), _opt(ref.top5_reference, fmt_pct)]
            + ["reference"] * (len(QUALITY_HEADER) - 3)
        )
    rows += [_quality_row(e) for e in q.engines]
    lines += _table(QUALITY_HEADER, rows)
    lines.append("")
    if KL_PNG in plots:
        lines += [f"![Per-image KL distribution per engine, log x]({KL_PNG})", ""]

    lines += ["### Emulation gap", ""]
    gap = q.emulation_gap
    if gap is None:
        lines += [f"FP8 engine against its fake-quant emulation: {NOT_MEASURED}.", ""]
    else:
        lines += _table(
            ["Comparison", "Agreement", "Differ", "KL mean", "KL max"],
            [
                [
                    "FP8 engine vs fake-quant emulation",
                    fmt_pct(gap.agreement),
                    str(gap.differ_count),
                    fmt_sig(gap.kl_mean),
                    fmt_sig(gap.kl_max),
                ]
            ]
            + (
                [
                    [
                        "emulation vs itself, fp32 sums reordered (floor)",
                        fmt_pct(gap.floor_agreement),
                        _opt(gap.floor_differ_count, str),
                        _opt(gap.floor_kl_mean, fmt_sig),
                        "not recorded",
                    ]
                ]
                if gap.floor_agreement is not None
                else []
            ),
        )
        if gap.floor_agreement is not None:
            lines += [
                "",
                "The floor row runs the emulation again with only its memory layout changed "
                "(channels-last), which reorders fp32 sums. FP8 rounding amplifies such tiny "
                "differences to the size of the quantization noise over the network's depth, so "
                "no distinct kernel can be expected to agree with the emulation better than the "
                "floor; an engine near the floor computes what the recipe prescribes.",
            ]
        lines += [
            "",
            "A per-image comparison of top-1: an image where the FP8 engine differs from fp32 "
            "but its emulation does not is one where the two disagree, so at most "
            f"{gap.differ_count} of the FP8 engine's differences from fp32 are not reproduced "
            "by the emulation of the recipe. KL is compared only as a mean and maximum here.",
            "",
        ]

    lines += ["### NaN/Inf scan", ""]
    if not q.nonfinite:
        lines += [f"NaN/Inf scan: {NOT_MEASURED}.", ""]
    else:
        lines += _table(
            [
                "Engine",
                "Held-out checked",
                "Stress checked",
                "Non-finite held-out",
                "Non-finite stress",
            ],
            [
                [
                    _label(s.engine),
                    str(s.heldout_checked),
                    str(s.stress_checked),
                    ", ".join(s.nonfinite_heldout) or "none",
                    ", ".join(s.nonfinite_stress) or "none",
                ]
                for s in q.nonfinite
            ],
        )
        lines.append("")
    return lines


def _kernel_results(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Kernel time per group", ""]
    sp = r.speed
    if sp is None or not sp.kernels:
        return [*lines, f"Kernel time per group: {NOT_MEASURED}.", ""]
    lines += [
        "Profiler time per call in microseconds, by kernel group (kernel count in brackets).",
        "",
    ]
    rows = []
    for k in sp.kernels:
        cells = []
        for name in KERNEL_GROUPS:
            g = next((g for g in k.groups if g.group == name), None)
            cells.append("none" if g is None else f"{fmt_us(g.time_us)} ({g.count})")
        rows.append(
            [_label(k.engine), str(k.batch), str(k.kernel_count), fmt_us(k.total_us), *cells]
        )
    lines += _table(["Engine", "Batch", "Kernels", "Total us", *KERNEL_GROUPS], rows)
    lines.append("")
    if KERNELS_PNG in plots:
        lines += [f"![Kernel time per group per engine]({KERNELS_PNG})", ""]
    top = [
        [_label(k.engine), str(k.batch), _code(name), fmt_us(us)]
        for k in sp.kernels
        for name, us in k.top_kernels
    ]
    if top:
        tt = _table(["Engine", "Batch", "Kernel", "us"], top)
        lines += ["Largest kernels:", ""]
        lines += _maybe_collapsed("largest kernels per engine and batch", tt, len(top))
    return lines


def _variant_speed(speeds: list[BatchSpeed] | None) -> str:
    if not speeds:
        return NOT_MEASURED
    return "; ".join(f"batch {b.batch}: {_spread(b.ratio, fmt_ratio)}" for b in speeds)


def _variants(r: StudyRecord) -> list[str]:
    lines = ["### Variants", ""]
    if not r.variants:
        return [*lines, "No recipe variant was studied.", ""]
    rows = []
    for v in r.variants:
        vq = v.quality
        rows.append(
            [
                v.name,
                _code(v.recipe),
                str(v.selected_count),
                _opt(vq.top1 if vq and vq.labelled else None, fmt_pct),
                fmt_pct(vq.agreement) if vq else NOT_MEASURED,
                str(vq.differ_count) if vq else NOT_MEASURED,
                fmt_sig(vq.kl_mean) if vq else NOT_MEASURED,
                _variant_speed(v.speed),
            ]
        )
    lines += _table(
        [
            "Variant",
            "Recipe",
            "Selected",
            "Top-1",
            "Agreement",
            "Differ",
            "KL mean",
            "x median [q1, q3]",
        ],
        rows,
    )
    warn = [(v.name, b.batch, w) for v in r.variants for b in (v.speed or []) for w in b.warnings]
    lines.append("")
    for name, batch, w in warn:
        lines.append(f"- {name}, batch {batch}: {w}")
    if warn:
        lines.append("")
    return lines


def _results(r: StudyRecord) -> list[str]:
    plots = {name for name, _ in available_plots(r)}
    return [
        "## Results",
        "",
        *_speed_results(r, plots),
        *_quality_results(r, plots),
        *_kernel_results(r, plots),
        *_variants(r),
    ]


def _warnings(r: StudyRecord) -> list[str]:
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


def _other_formats(r: StudyRecord) -> list[str]:
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


def _not_tried(r: StudyRecord) -> list[str]:
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
    if "sensitivity" not in stated:
        derived.append(
            "Per-layer sensitivity (KL with one layer quantized) and per-layer speed gain are "
            "not part of this record."
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
            f"Only the {_code(r.calibration.calibrator)} calibrator was run for the main recipe."
        )
    if _engine_quality(r, WEIGHT_ONLY) is None or _engine_quality(r, ACT_ONLY) is None:
        derived.append("No weight-only and activation-only runs: the loss is not attributed.")
    if not r.variants:
        derived.append("No recipe variant.")
    if not r.data.labelled:
        derived.append("No accuracy against labels: the data is unlabelled.")
    lines += [f"- {x}" for x in derived]
    return [*lines, ""]


def _revisit(r: StudyRecord) -> list[str]:
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
    failed = [g for g in d.gates if not g.passed]
    off_gpu = [g for g in failed if g.kind == "speed" and g.measured.startswith(NOT_ON_GPU)]
    random = [g for g in failed if g.measured.startswith(RANDOM_WEIGHTS)]
    unmeasured = [
        g for g in failed if g not in off_gpu and g.measured.startswith(("not measured", "timed"))
    ]
    speed = [
        g
        for g in failed
        if g.name.startswith((SPEED_MARGIN, SPEED_SPREAD)) and g not in off_gpu + unmeasured
    ]
    leads = {
        AGREEMENT: "Quality: when a calibration or layer choice keeps top-1 agreement within "
        "the threshold.",
        KL_MEAN: "Quality: when a calibration or layer choice keeps the mean KL within the "
        "threshold.",
        TOP1_CI: "Quality: when the top-1 change's CI clears the threshold; a larger held-out "
        "set likely narrows the CI, and fewer FP8 layers or another calibrator may move it "
        "(not measured here).",
        FINITE: "Quality: when no engine produces a non-finite logit.",
    }

    def detailed(lead: str, gs: list[Gate]) -> list[str]:
        return [
            f"- {lead} Failed here:",
            *(f"  - {g.name}: {g.measured}; needs {g.threshold}." for g in gs),
        ]

    def shared(lead: str, gs: list[Gate]) -> list[str]:
        return [f"- {lead} Failed for that reason: {', '.join(g.name for g in gs)}."]

    if off_gpu:
        lines += shared(
            "Run the study on a GPU: the speed gates cannot pass without GPU timings "
            f"({off_gpu[0].measured}).",
            off_gpu,
        )
    if speed:
        lines += detailed(
            "Speed: when an FP8 matrix-product kernel (1x1 convolution or linear) is faster "
            "than fp16 at these shapes and the activation quantize fuses into its producer.",
            speed,
        )
    if random:
        lines += shared(
            "With pretrained weights: quality measured on random weights is not evidence.",
            random,
        )
    if unmeasured:
        lines += detailed("When the missing measurements exist.", unmeasured)
    grouped = {id(g) for g in off_gpu + speed + random + unmeasured}
    for g in failed:
        if id(g) not in grouped:
            lines += detailed(leads.get(g.name, f"When {g.name} passes."), [g])
    return [*lines, ""]


def render_markdown(record: StudyRecord) -> str:
    """The study's Markdown section; deterministic, every number from `record`."""
    r = record
    lines = [
        *_title(r),
        *_summary(r),
        *_recipe(r),
        *_method(r),
        *_results(r),
        *_warnings(r),
        *_other_formats(r),
        *_not_tried(r),
        *_revisit(r),
    ]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"
