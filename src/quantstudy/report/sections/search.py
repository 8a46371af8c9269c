"""Results of `quantstudy search`, when the record holds them (schema version 2 on): per-layer
sensitivity, per-layer speed, and the search's prediction beside what the studies measured. A
record without them renders nothing here."""

from __future__ import annotations

from collections.abc import Callable

from quantstudy.record import (
    LayerChoice,
    LayerSensitivity,
    LayerSpeed,
    Measured,
    OptionStep,
    SearchPrediction,
    StudyRecord,
)
from quantstudy.report.format import (
    NOT_MEASURED,
    code,
    fence,
    fmt_ms,
    fmt_pct,
    fmt_ratio,
    fmt_sig,
    maybe_collapsed,
    opt,
    spread,
    table,
)
from quantstudy.report.search_plots import SENSITIVITY_PNG
from quantstudy.report.sections.tables import TableSpec, columns

NOT_RECORDED = "not recorded"
ALL_BUT = "all_but"  # column group: the recipe with each layer left out
TIMED = "timed"  # column group: per-layer timings (absent when gains came from a short file)


def _sensitivity_row(item: tuple[LayerSensitivity, bool]) -> list[str]:
    x, all_but = item
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
    return row


SENSITIVITY_TABLE = TableSpec(
    "per-layer sensitivity",
    columns("Rank", "Layer", "Kind", "KL mean", "KL max", "Agreement", "Differ")
    + columns("All-but KL mean", "All-but agreement", "All-but differ", group=ALL_BUT),
    _sensitivity_row,
)


def _layer_speed_row(item: tuple[LayerSpeed, bool]) -> list[str]:
    x, timed = item
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
    return row


LAYER_SPEED_TABLE = TableSpec(
    "per-layer speed",
    columns("Rank", "Layer", "Kind")
    + columns(
        "Input shape",
        "FP8 path",
        "fp16 ms median [q1, q3]",
        "FP8 ms median [q1, q3]",
        "x median [q1, q3]",
        group=TIMED,
    )
    + columns("Saved ms"),
    _layer_speed_row,
)


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
    def ms(v: float | None, fmt: Callable[[float], str] = fmt_ms) -> str:
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


def _prediction_row(item: tuple[str, SearchPrediction | Measured]) -> list[str]:
    name, figures = item
    if isinstance(figures, SearchPrediction):
        return _predicted_row(name, figures)
    return _measured_row(name, figures)


PREDICTION_TABLE = TableSpec(
    "prediction and measurement",
    columns(
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
    ),
    _prediction_row,
)


def _choice_row(c: LayerChoice) -> list[str]:
    return [
        code(c.layer),
        "yes" if c.chosen else "no",
        fmt_sig(c.kl_mean),
        fmt_pct(c.disagreement),
        fmt_sig(c.saved_ms),
        c.reason,
    ]


CHOICE_TABLE = TableSpec(
    "layer choice",
    columns("Layer", "Chosen", "KL mean", "Disagreement", "Saved ms", "Reason"),
    _choice_row,
)
TABLES = [SENSITIVITY_TABLE, LAYER_SPEED_TABLE, PREDICTION_TABLE, CHOICE_TABLE]


def render_search(r: StudyRecord, plots: set[str]) -> list[str]:
    return [*_sensitivity(r, plots), *_layer_speed(r), *_search(r)]


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
    tt = SENSITIVITY_TABLE.render(
        [(x, all_but) for x in s.layers], groups=[ALL_BUT] if all_but else []
    )
    lines += maybe_collapsed(f"{len(s.layers)} layers ranked by sensitivity", tt, len(s.layers))
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
    tt = LAYER_SPEED_TABLE.render([(x, timed) for x in ls.layers], groups=[TIMED] if timed else [])
    lines += maybe_collapsed(f"{len(ls.layers)} layers ranked by saved time", tt, len(ls.layers))
    warn = [(x.layer, w) for x in ls.layers for w in x.warnings]
    for layer, w in warn:
        lines.append(f"- {code(layer)}: {w}")
    if warn:
        lines.append("")
    return lines


def _predictions(r: StudyRecord) -> list[tuple[str, SearchPrediction | None, Measured | None]]:
    """(name, prediction, measurement) of each recipe the record predicts something for."""
    out = [(v.name, v.predicted, v.measured) for v in r.variants if v.predicted or v.measured]
    s = r.search
    if s is not None:
        if not out:
            out.append(("candidate", s.candidate_predicted, s.candidate_measured))
        out.append(("searched", s.predicted, s.verified))
    return out


def _options(steps: list[OptionStep] | None) -> list[str]:
    """The option step (`search/options.py`); nothing for searches that predate it."""
    if not steps:
        return []
    paired = any(st.kl_change is not None for st in steps)
    rows = []
    for st in steps:
        change = "-"
        if st.kl_change is not None:
            low, high = opt(st.kl_change_low, fmt_sig), opt(st.kl_change_high, fmt_sig)
            change = f"{fmt_sig(st.kl_change)} [{low}, {high}]"
        row = [st.option, fmt_sig(st.kl_mean), *([change] if paired else [])]
        row += [
            fmt_pct(st.agreement),
            "kept" if st.kept else "not kept",
            fmt_pct(st.share) if st.share is not None else "-",
        ]
        rows.append(row)
    rule = (
        "kept when the paired change in KL mean against the options kept before it (the same "
        "images, 95% bootstrap interval) lay below zero"
        if paired
        else "kept when it lowered the KL mean"
    )
    head = ["option", "KL mean", *(["KL change [95% CI]"] if paired else [])]
    return [
        "FP8 quality options, each tried on top of those kept before it, the fp32 emulation of "
        f"every candidate layer scored against fp32 on the sensitivity subset, and {rule}; "
        "share: of the total KL decrease the kept options bought, in this order.",
        "",
        *table([*head, "agreement", "kept", "share"], rows),
        "",
    ]


def _search(r: StudyRecord) -> list[str]:
    s = r.search
    figures: list[tuple[str, SearchPrediction | Measured]] = []
    studies = []
    for name, p, m in _predictions(r):
        if p is not None:
            figures.append((name, p))
        if m is not None:
            figures.append((name, m))
            studies.append(
                f"- {name}: measured by the study in {code(m.study)} ({code(m.recipe)})."
            )
    if s is None and not figures:
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
            *_options(s.options),
        ]
    if figures:
        lines += [
            "The prediction beside the measurement. Predicted: the additive model, sums over the "
            "chosen layers of the per-layer KL means, disagreements and savings of the tables "
            "above; fp16 ms is the candidate study's whole-model median when its timings are "
            "meaningful. Measured: the recipe's own study, the FP8 engine against fp32 on the "
            "whole held-out set, and the recipe's fake-quant emulation on the same images; x is "
            "the median of the per-round ratio fp16 / FP8.",
            "",
            *PREDICTION_TABLE.render(figures),
            "",
            *studies,
            "",
        ]
    if s is not None and s.choices:
        tt = CHOICE_TABLE.render(s.choices)
        lines += ["The choice, layer by layer:", ""]
        lines += maybe_collapsed(
            f"{len(s.choices)} candidate layers: choice and reason", tt, len(s.choices)
        )
    return lines
