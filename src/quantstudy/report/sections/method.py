"""The method section: environment, model and engines, data, preprocessing, calibration, timing
and quality method, as recorded, so that a reader can repeat the study."""

from __future__ import annotations

from collections import Counter

from quantstudy.env.switches import switches_said
from quantstudy.quant import backends
from quantstudy.quant.cublaslt.problem import LT_NOTE_HEAD
from quantstudy.record import FP8Layout, StudyRecord
from quantstudy.record.vocab import FASTEST
from quantstudy.report.format import (
    NOT_MEASURED,
    code,
    fence,
    fmt_plain,
    maybe_collapsed,
    opt,
    table,
)
from quantstudy.report.lookups import FP8, engine_quality, label
from quantstudy.report.sections.calibration import method_calibration


def render_method(r: StudyRecord) -> list[str]:
    lines = ["## Method", ""]
    for part in (
        _method_environment,
        _method_model,
        _method_data,
        _method_preprocessing,
        method_calibration,
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
    said = switches_said(env.lab_switches)  # engines computed or tuned otherwise than the commit
    if said:
        rows.append(["Lab switches (`env/switches.py`)", said])
    lines += table(["Item", "Value"], rows)
    c = r.config
    lines += ["", "Study configuration as recorded:", ""]
    lines += table(
        ["Setting", "Value"],
        [
            ["model", c.model],
            ["weights", c.weights],
            ["data", c.data],
            ["calibration data", c.calib_data or "same folder as data"],
            ["recipe", c.recipe],
            ["calibration images", _asked(c.calib, r.data.calibration.n_images)],
            ["held-out images", _asked(c.heldout, r.data.heldout.n_images)],
            ["seed", str(c.seed)],
            ["device", c.device],
            ["batches", ", ".join(str(b) for b in c.batches)],
            ["compile mode", c.compile_mode],
            *([["FP8 kernel", c.fp8_kernel]] if c.fp8_kernel else []),
            *([["FP8 accumulation", c.fp8_accumulate]] if c.fp8_accumulate else []),
            ["test-size settings", "yes" if c.test_settings else "no"],
            ["policy", c.policy],
        ],
    )

    return lines


def _method_model(r: StudyRecord) -> list[str]:
    m = r.model
    lines = ["### Model and engines", ""]
    tag = f", pretrained tag {code(m.pretrained_tag)}" if m.pretrained_tag else ""
    sha = f", sha256 {code(m.weights_sha256)}" if m.weights_sha256 else ""
    lines += [
        f"Model {code(m.name)} (architecture {code(m.architecture)}{tag}), {m.num_params} "
        f"parameters, {m.num_classes} classes, seed {m.seed}. Weights: {m.weights}, "
        f"{m.weights_detail}{sha}.",
        "",
    ]
    if r.engines:
        rows = [
            [
                label(e.name),
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
        header = ["Engine", "Compute dtype", "Device", "Compiled", "Compile mode", "CUDA graphs"]
        header += ["channels_last", "FP8 real", "FP8 emulated", "Other conv/linear", "Numerics"]
        lines += table(header, rows)
        lines += _kernel_lines(r)
    else:
        lines.append(f"Engines: {NOT_MEASURED}.")

    return lines


# What an engine of the option "fastest" ran; a backend's own line is its `Backend.summary`.
FASTEST_SUMMARY = (
    "per layer the faster of the fused kernel and torch._scaled_mm, timed in "
    "place when the engine was built; a selected layer whose float layer was faster than both "
    "at every timed batch stayed in the engine's dtype (the speed section lists each layer)"
)


def kernel_summary(kernel: str) -> str:
    """What an engine of `--fp8-kernel kernel` ran, in one line: the backend's own summary
    (`quant/backends/`), "not described" for a backend this install does not have."""
    if kernel == FASTEST:
        return FASTEST_SUMMARY
    return backends.get(kernel).summary if kernel in backends.names() else "not described"


def _kernel_lines(r: StudyRecord) -> list[str]:
    """Which FP8 product the engines ran, and the activations it absorbed (schema 3 on)."""
    lines = []
    for e in r.engines or []:
        fp8, kernel = e.layout, e.layout.kernel_option
        if kernel is None:
            continue
        acts = Counter(fp8.epilogue.values())
        absorbed = ", ".join(f"{name} x{n}" for name, n in sorted(acts.items())) or "none"
        lines += [
            "",
            f"The {label(e.name)} engine's real FP8 layers ran the {code(kernel)} kernel: "
            f"{kernel_summary(kernel)}. Activations computed in the FP8 "
            f"layers' epilogue ({len(fp8.epilogue)} of {len(e.fp8_real)} layers): {absorbed}.",
        ]
        notes = fp8.scaled_mm_output.split("; ") if fp8.scaled_mm_output else []
        for note in notes:  # each backend's (`Backend.output_note`); torch._scaled_mm's: a dtype
            whole = note.startswith(LT_NOTE_HEAD)
            lines[-1] += f" {note}." if whole else f" torch._scaled_mm wrote {note}."
        lines[-1] += _gelu_sentence(fp8)
        if fp8.handoff:
            pairs = ", ".join(f"{code(p)} -> {code(c)}" for p, c in sorted(fp8.handoff.items()))
            n = len(fp8.handoff)
            lines[-1] += (
                f" {n} FP8 {'layer' if n == 1 else 'layers'} wrote the next FP8 layer's input "
                f"already quantized (no fp16 output, no quantize pass between them): {pairs}."
            )
        if fp8.residual:
            n, acts = len(fp8.residual), Counter(fp8.residual.values())
            after = ", ".join(f"{a} x{k}" for a, k in sorted(acts.items()))
            names = ", ".join(code(layer) for layer in sorted(fp8.residual))
            lines[-1] += (
                f" {n} FP8 {'layer' if n == 1 else 'layers'} summed their block's residual in "
                f"the epilogue (the add and the activation after it, {after}; no fp16 output "
                f"before the add): {names}."
            )
        if fp8.sum_handoff:
            pairs = ", ".join(f"{code(p)} -> {code(c)}" for p, c in sorted(fp8.sum_handoff.items()))
            n = len(fp8.sum_handoff)
            lines[-1] += (
                f" {n} of those also wrote the next FP8 layer's input, quantized, beside the "
                f"sum (no quantize pass between them): {pairs}."
            )
        if fp8.padded_output:
            pairs = ", ".join(
                f"{code(p)} -> {code(c)}" for p, c in sorted(fp8.padded_output.items())
            )
            n = len(fp8.padded_output)
            wrote = "layer wrote its" if n == 1 else "layers wrote their"
            lines[-1] += (
                f" {n} FP8 {wrote} output inside the "
                f"zero padding of the conv that reads it (no padding pass between them): {pairs}."
            )
        for rewrite, why in sorted(fp8.rewrites_skipped.items()):
            lines[-1] += f" Rewrite {code(rewrite)} not applied: {why}."
    return lines


def _gelu_sentence(fp8: FP8Layout) -> str:
    """Which layers ran GELU in the tanh form (schema 27 on), where any did; "" otherwise."""
    tanh = fp8.tanh_gelu
    if not tanh:
        return ""
    names = ", ".join(code(n) for n in tanh)
    return (
        f" GELU ran in the tanh form (cuBLASLt's epilogue; timm's is erf) on {len(tanh)} of the "
        f"{len(fp8.gelu)} layers whose epilogue computes it ({names}); the emulation computes "
        "the same form there, so the gap to it leaves the two forms' difference out and the "
        "quality against fp32 takes it in."
    )


def _method_data(r: StudyRecord) -> list[str]:
    data = r.data
    lines = ["### Data", ""]
    lines += [
        f"Data folder {code(data.data_dir)}, calibration folder "
        f"{code(data.calib_dir) if data.calib_dir else 'the same'}, class list "
        f"{code(data.class_list) if data.class_list else 'none'}, labelled: "
        f"{'yes' if data.labelled else 'no'}, split seed {data.seed}.",
        "",
    ]
    sets = [data.calibration, data.heldout]
    lines += table(
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
                code(s.folder),
                "yes" if s.labelled else "no",
                str(s.n_images),
                opt(s.n_classes, str, "unlabelled"),
                opt(s.per_class_min, str, "unlabelled"),
                opt(s.per_class_max, str, "unlabelled"),
                code(s.ids_sha256),
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
        sk = table(["Image", "Reason"], [[code(x.id), x.reason] for x in data.skipped])
        lines += maybe_collapsed(f"{len(data.skipped)} skipped images", sk, len(data.skipped))

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
            *fence(sp.timed_region),
            "",
        ]

    return lines


def _method_quality(r: StudyRecord) -> list[str]:
    lines = ["### Quality method", ""]
    q = r.quality
    if q is None:
        lines += [f"Quality: {NOT_MEASURED}.", ""]
    else:
        eq8 = engine_quality(r, FP8)
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


def _asked(asked: int | str, used: int) -> str:
    """An image count as asked, and what was used where the data could not meet it; an `auto`
    held-out size with the count its rounds took, which is no shortfall (the sequential results
    say why the rounds stopped)."""
    if isinstance(asked, str):
        return f"{asked} ({used} used)"
    return str(asked) if used == asked else f"{asked} asked; {used} used (all the data had)"
