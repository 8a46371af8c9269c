"""The results section: speed and size, quality, emulation gap, NaN/Inf scan, kernel groups and
recipe variants, each table next to the plot drawn from the same record."""

from __future__ import annotations

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
from quantstudy.report.plots import KERNELS_PNG, KL_PNG, LATENCY_PNG, available_plots
from quantstudy.study.schema import BatchSpeed, EngineQuality, StudyRecord

KERNEL_GROUPS = ("fp8_matmul", "fp16_matmul_conv", "depthwise_conv", "quantize_convert", "other")


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


def render_results(r: StudyRecord) -> list[str]:
    plots = {name for name, _ in available_plots(r)}
    return [
        "## Results",
        "",
        *_speed_results(r, plots),
        *_quality_results(r, plots),
        *_kernel_results(r, plots),
        *_variants(r),
    ]
