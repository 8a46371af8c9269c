"""The results section: speed and size, quality, emulation gap, NaN/Inf scan, kernel groups and
recipe variants, each table next to the plot drawn from the same record.

Under the variants come the tables of `quantstudy search` when the record holds them (schema
version 2): per-layer sensitivity, per-layer speed, and the search's prediction set beside what
the studies measured. A record without them renders exactly as before."""

from __future__ import annotations

from quantstudy.record import (
    BatchSpeed,
    EngineQuality,
    Measured,
    SearchPrediction,
    StudyRecord,
)
from quantstudy.record.vocab import KernelGroup, choices
from quantstudy.report.format import (
    NOT_MEASURED,
    code,
    fence,
    fmt_mib,
    fmt_ms,
    fmt_pct,
    fmt_points,
    fmt_ratio,
    fmt_sig,
    fmt_us,
    maybe_collapsed,
    opt,
    spread,
    table,
)
from quantstudy.report.lookups import (
    CPU_BANNER,
    FP8,
    FP16,
    RANDOM_WEIGHTS_BANNER,
    label,
    weight_bytes,
)
from quantstudy.report.plots import (
    KERNELS_PNG,
    KL_PNG,
    LATENCY_PNG,
    SENSITIVITY_PNG,
    available_plots,
)

KERNEL_GROUPS = choices(KernelGroup)


def _random(r: StudyRecord) -> bool:
    return r.model.random_weights or (r.quality is not None and not r.quality.meaningful)


def _speed_results(r: StudyRecord, plots: set[str]) -> list[str]:
    lines = ["### Speed and size", ""]
    sp = r.speed
    wb = weight_bytes(r)
    if sp is None or not sp.batches:
        lines += [f"Speed: {NOT_MEASURED}.", ""]
    else:
        if not sp.meaningful:
            words = CPU_BANNER if "cuda" not in sp.device.lower() else "timings are not meaningful"
            lines += [f"**Warning: {words}** ({sp.meaningless_reason or sp.device}).", ""]
        w16 = fmt_mib(wb[FP16]) if FP16 in wb else NOT_MEASURED
        w8 = fmt_mib(wb[FP8]) if FP8 in wb else NOT_MEASURED
        lines += table(
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
                    spread(b.fp16_ms, fmt_ms),
                    spread(b.fp8_ms, fmt_ms),
                    spread(b.ratio, fmt_ratio),
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
        lines += table(
            ["Engine", "Weight bytes", "MiB"],
            [[label(k), str(v), fmt_mib(v)] for k, v in wb.items()],
        )
        lines.append("")
    if sp is not None and sp.package_bytes:
        lines += table(
            ["Engine", "Compiled package bytes", "MiB"],
            [[label(k), str(v), fmt_mib(v)] for k, v in sp.package_bytes.items()],
        )
        lines.append("")
    else:
        lines += ["Compiled package size: not measured.", ""]
    return lines


def _quality_row(e: EngineQuality) -> list[str]:
    nl = "no labels"
    change = nl
    if e.labelled:
        change = opt(e.top1_change, fmt_points)
        if e.ci_low is not None and e.ci_high is not None:
            change += f" [{fmt_points(e.ci_low)}, {fmt_points(e.ci_high)}]"
    return [
        label(e.engine),
        opt(e.top1, fmt_pct) if e.labelled else nl,
        opt(e.top5, fmt_pct) if e.labelled else nl,
        fmt_pct(e.agreement),
        str(e.differ_count),
        opt(e.gained, str) if e.labelled else nl,
        opt(e.lost, str) if e.labelled else nl,
        opt(e.net_change, lambda v: f"{v:+d}") if e.labelled else nl,
        change,
        opt(e.mcnemar_p, fmt_sig) if e.labelled else nl,
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
            [label(q.reference), fmt_pct(ref.top1_reference), opt(ref.top5_reference, fmt_pct)]
            + ["reference"] * (len(QUALITY_HEADER) - 3)
        )
    rows += [_quality_row(e) for e in q.engines]
    lines += table(QUALITY_HEADER, rows)
    lines.append("")
    if KL_PNG in plots:
        lines += [f"![Per-image KL distribution per engine, log x]({KL_PNG})", ""]

    lines += ["### Emulation gap", ""]
    gap = q.emulation_gap
    if gap is None:
        lines += [f"FP8 engine against its fake-quant emulation: {NOT_MEASURED}.", ""]
    else:
        lines += table(
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
                        opt(gap.floor_differ_count, str),
                        opt(gap.floor_kl_mean, fmt_sig),
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
        lines += table(
            [
                "Engine",
                "Held-out checked",
                "Stress checked",
                "Non-finite held-out",
                "Non-finite stress",
            ],
            [
                [
                    label(s.engine),
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
            [label(k.engine), str(k.batch), str(k.kernel_count), fmt_us(k.total_us), *cells]
        )
    lines += table(["Engine", "Batch", "Kernels", "Total us", *KERNEL_GROUPS], rows)
    lines.append("")
    if KERNELS_PNG in plots:
        lines += [f"![Kernel time per group per engine]({KERNELS_PNG})", ""]
    top = [
        [label(k.engine), str(k.batch), code(name), fmt_us(us)]
        for k in sp.kernels
        for name, us in k.top_kernels
    ]
    if top:
        tt = table(["Engine", "Batch", "Kernel", "us"], top)
        lines += ["Largest kernels:", ""]
        lines += maybe_collapsed("largest kernels per engine and batch", tt, len(top))
    return lines


def _variant_speed(speeds: list[BatchSpeed] | None) -> str:
    if not speeds:
        return NOT_MEASURED
    return "; ".join(f"batch {b.batch}: {spread(b.ratio, fmt_ratio)}" for b in speeds)


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
                code(v.recipe),
                str(v.selected_count),
                opt(vq.top1 if vq and vq.labelled else None, fmt_pct),
                fmt_pct(vq.agreement) if vq else NOT_MEASURED,
                str(vq.differ_count) if vq else NOT_MEASURED,
                fmt_sig(vq.kl_mean) if vq else NOT_MEASURED,
                _variant_speed(v.speed),
            ]
        )
    lines += table(
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


NOT_RECORDED = "not recorded"


def _sensitivity(r: StudyRecord, plots: set[str]) -> list[str]:
    s = r.sensitivity
    if s is None:
        return []
    all_but = "all_but" in s.modes or any(x.all_but_kl_mean is not None for x in s.layers)
    lines = [
        "#### Per-layer sensitivity",
        "",
        f"The fake-quant model against {s.reference} with only one candidate layer quantized, "
        f"on {s.n_images} images ({s.subset}), ranked by {s.ranked_by}. Agreement is top-1 "
        f"agreement with {s.reference}; Differ counts the images whose top-1 differs from it."
        + (
            " The all-but columns quantize every candidate layer except that one."
            if all_but
            else ""
        ),
        "",
        f"Every candidate layer quantized, on the same images: KL mean {fmt_sig(s.all_kl_mean)}, "
        f"agreement {fmt_pct(s.all_agreement)}.",
        "",
    ]
    if s.ids_sha256:
        lines += [f"SHA-256 of the images' ids: {code(s.ids_sha256)}.", ""]
    header = ["Rank", "Layer", "Kind", "KL mean", "KL max", "Agreement", "Differ"]
    if all_but:
        header += ["All-but KL mean", "All-but agreement", "All-but differ"]
    rows = []
    for x in s.layers:
        row = [
            str(x.rank),
            code(x.layer),
            x.kind,
            fmt_sig(x.kl_mean),
            fmt_sig(x.kl_max),
            fmt_pct(x.agreement),
            str(x.differ_count),
        ]
        if all_but:
            row += [
                opt(x.all_but_kl_mean, fmt_sig),
                opt(x.all_but_agreement, fmt_pct),
                opt(x.all_but_differ_count, str),
            ]
        rows.append(row)
    lines += maybe_collapsed(
        f"{len(s.layers)} layers ranked by sensitivity", table(header, rows), len(rows)
    )
    if SENSITIVITY_PNG in plots:
        lines += [
            f"![KL mean per layer with only that layer quantized, log x]({SENSITIVITY_PNG})",
            "",
        ]
    return lines


def _layer_speed(r: StudyRecord) -> list[str]:
    ls = r.layer_speed
    if ls is None:
        return []
    lines = ["#### Per-layer speed", ""]
    if ls.source == "file":
        lines += [
            "**These per-layer gains were not measured by this study**: they were read from "
            f"the file {code(ls.source_detail)}, for batch {ls.batch}. They are evidence only "
            "as far as that file is.",
            "",
        ]
    else:
        how = [f"compile mode {ls.compile_mode}"] if ls.compile_mode else []
        if ls.rounds is not None:
            how.append(f"{ls.rounds} rounds")
        if ls.iters_per_round is not None:
            how.append(f"{ls.iters_per_round} calls per round")
        if ls.warmup is not None:
            how.append(f"{ls.warmup} warm-up calls")
        lines += [
            f"Measured by this study on {ls.source_detail}, batch {ls.batch}: each layer's own "
            "operation at its real input shape, fp16 against FP8"
            + (f" ({', '.join(how)})" if how else "")
            + ". Saved ms is the fp16 median minus the FP8 median; negative when FP8 is slower.",
            "",
        ]
        if not ls.meaningful:
            lines += ["**Warning: these per-layer timings are not meaningful.**", ""]
        if ls.timed_region:
            lines += ["Timed region:", "", *fence(ls.timed_region), ""]
    timed = any(x.fp16_ms is not None or x.fp8_ms is not None for x in ls.layers)
    header = ["Rank", "Layer", "Kind"]
    if timed:
        header += [
            "Input shape",
            "FP8 path",
            "fp16 ms median [q1, q3]",
            "FP8 ms median [q1, q3]",
            "x median [q1, q3]",
        ]
    header.append("Saved ms")
    rows = []
    for x in ls.layers:
        row = [str(x.rank), code(x.layer), x.kind or NOT_RECORDED]
        if timed:
            row += [
                " x ".join(str(d) for d in x.input_shape) if x.input_shape else NOT_RECORDED,
                x.fp8_path or NOT_RECORDED,
                spread(x.fp16_ms, fmt_sig) if x.fp16_ms else NOT_MEASURED,
                spread(x.fp8_ms, fmt_sig) if x.fp8_ms else NOT_MEASURED,
                spread(x.ratio, fmt_ratio) if x.ratio else NOT_MEASURED,
            ]
        row.append(fmt_sig(x.saved_ms))
        rows.append(row)
    lines += maybe_collapsed(
        f"{len(ls.layers)} layers ranked by saved time", table(header, rows), len(rows)
    )
    warn = [(x.layer, w) for x in ls.layers for w in x.warnings]
    for layer, w in warn:
        lines.append(f"- {code(layer)}: {w}")
    if warn:
        lines.append("")
    return lines


PREDICTION_HEADER = [
    "Recipe",
    "Figures",
    "Layers",
    "KL mean",
    "Agreement",
    "Fake-quant KL mean",
    "Fake-quant agreement",
    "Saved ms",
    "fp16 ms",
    "FP8 ms",
    "x",
    "Decision",
]


def _predicted_row(name: str, p: SearchPrediction) -> list[str]:
    return [
        name,
        f"predicted, batch {p.batch}",
        str(len(p.layers)),
        fmt_sig(p.kl_mean),
        fmt_pct(p.agreement),
        "n/a",
        "n/a",
        fmt_sig(p.saved_ms),
        opt(p.fp16_ms, fmt_ms),
        opt(p.fp8_ms, fmt_ms),
        opt(p.speedup, fmt_ratio),
        "n/a",
    ]


def _measured_row(name: str, m: Measured) -> list[str]:
    def ms(v: float | None, fmt=fmt_ms) -> str:
        if v is None:
            return NOT_MEASURED
        return fmt(v) + ("" if m.speed_meaningful else " (not meaningful)")

    decision = "no decision"
    if m.ship is not None:
        decision = "ships" if m.ship else "does not ship"
    return [
        name,
        "measured" + (f", batch {m.batch}" if m.batch is not None else ""),
        str(m.n_layers),
        fmt_sig(m.kl_mean),
        fmt_pct(m.agreement),
        opt(m.fakequant_kl_mean, fmt_sig),
        opt(m.fakequant_agreement, fmt_pct),
        NOT_RECORDED,
        ms(m.fp16_ms),
        ms(m.fp8_ms),
        ms(m.speedup, fmt_ratio),
        decision,
    ]


def _predictions(r: StudyRecord) -> list[tuple[str, SearchPrediction | None, Measured | None]]:
    """(name, prediction, measurement) of each recipe the record predicts something for."""
    out = [(v.name, v.predicted, v.measured) for v in r.variants if v.predicted or v.measured]
    s = r.search
    if s is not None:
        if not out:
            out.append(("candidate", s.candidate_predicted, s.candidate_measured))
        out.append(("searched", s.predicted, s.verified))
    return out


def _search(r: StudyRecord) -> list[str]:
    s = r.search
    rows = []
    studies = []
    for name, p, m in _predictions(r):
        if p is not None:
            rows.append(_predicted_row(name, p))
        if m is not None:
            rows.append(_measured_row(name, m))
            studies.append(
                f"- {name}: measured by the study in {code(m.study)} ({code(m.recipe)})."
            )
    if s is None and not rows:
        return []
    lines = ["#### Recipe search" if s is not None else "#### Predicted and measured", ""]
    if s is not None:
        b = s.budget
        written = f", written to {code(s.recipe_file)}" if s.recipe_file else ""
        method = s.method if s.method.endswith(".") else s.method + "."
        lines += [
            f"From the candidate recipe {code(s.candidate_recipe)}, {len(s.predicted.layers)} of "
            f"{len(s.choices)} candidate layers were chosen for batch {s.predicted.batch}"
            f"{written}.",
            "",
            f"Quality budget: {fmt_pct(b.margin)} of the policy's ({code(b.policy)}): a predicted "
            f"KL mean of at most {fmt_sig(b.kl_budget)} (the policy allows "
            f"{fmt_sig(b.max_kl_mean)}) and a predicted disagreement of at most "
            f"{fmt_pct(b.disagreement_budget)} (the policy's minimum agreement is "
            f"{fmt_pct(b.min_agreement)}).",
            "",
            f"Method: {method}",
            "",
        ]
    if rows:
        lines += [
            "The prediction beside the measurement. Predicted: the additive model, sums over the "
            "chosen layers of the per-layer KL means, disagreements and savings of the tables "
            "above; fp16 ms is the candidate study's whole-model median when its timings are "
            "meaningful. Measured: the recipe's own study, the FP8 engine against fp32 on the "
            "whole held-out set, and the recipe's fake-quant emulation on the same images; x is "
            "the median of the per-round ratio fp16 / FP8.",
            "",
            *table(PREDICTION_HEADER, rows),
            "",
            *studies,
            "",
        ]
    if s is not None and s.choices:
        choice_rows = [
            [
                code(c.layer),
                "yes" if c.chosen else "no",
                fmt_sig(c.kl_mean),
                fmt_pct(c.disagreement),
                fmt_sig(c.saved_ms),
                c.reason,
            ]
            for c in s.choices
        ]
        tt = table(
            ["Layer", "Chosen", "KL mean", "Disagreement", "Saved ms", "Reason"], choice_rows
        )
        lines += ["The choice, layer by layer:", ""]
        lines += maybe_collapsed(
            f"{len(s.choices)} candidate layers: choice and reason", tt, len(choice_rows)
        )
    return lines


def render_results(r: StudyRecord) -> list[str]:
    plots = {name for name, _ in available_plots(r)}
    return [
        "## Results",
        "",
        *_speed_results(r, plots),
        *_quality_results(r, plots),
        *_kernel_results(r, plots),
        *_variants(r),
        *_sensitivity(r, plots),
        *_layer_speed(r),
        *_search(r),
    ]
