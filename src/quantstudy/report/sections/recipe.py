"""The recipe section: what the recipe selects and excludes, each with its rule and reason, and
how the FP8 engine ran each selected layer."""

from __future__ import annotations

from quantstudy.record import LayerDecision, RecipeInfo, StudyRecord
from quantstudy.report.format import (
    COLLAPSE_ROWS,
    NOT_MEASURED,
    code,
    fmt_plain,
    hw,
    maybe_collapsed,
    table,
)
from quantstudy.report.lookups import FP8


def _layer_rows(
    layers: list[LayerDecision],
    real: set[str],
    emulated: set[str],
    other: str,
    stepped: frozenset[str] = frozenset(),
) -> list[list[str]]:
    rows = []
    for x in layers:
        runs = "FP8" if x.name in real else "emulated" if x.name in emulated else other
        runs += " (FP8 slower)" if x.name in stepped else ""
        rows.append(
            [
                code(x.name),
                x.op,
                hw(x.kernel),
                hw(x.stride),
                str(x.groups),
                str(x.in_channels),
                str(x.out_channels),
                hw(x.input_hw),
                "none (default off)" if x.rule is None else str(x.rule),
                runs,
                x.reason,
            ]
        )
    return rows


BIAS_CORRECTION = (
    ", biases corrected by the mean output shift of FP8 weight rounding ((Wq - W) . E[x], E[x] "
    "the per-channel input mean over the calibration images)"
)


def _row_scales(rc: RecipeInfo) -> str:
    """Which layers took dynamic per-row scales, for the recipe line."""
    narrow = rc.per_row_max_channels
    where = f" whose input has at most {narrow} channels" if narrow is not None else ""
    return f"dynamic per-row scales in the 1x1 convs and linear layers{where}, elsewhere "


def _rounding(rc: RecipeInfo) -> str:
    """How the weights were rounded, for the recipe line (nothing for nearest)."""
    if rc.rounding != "compensating":
        return ""
    searched = []
    if rc.scale_candidates > 1:
        searched.append(f"{rc.scale_candidates} scale candidates per channel")
    if rc.refine_sweeps > 0:
        searched.append(f"{rc.refine_sweeps} refinement sweeps")
    return ", rounded compensating" + (f" ({' and '.join(searched)})" if searched else "")


def render_recipe(r: StudyRecord) -> list[str]:
    lines = ["## Recipe", ""]
    rc = r.recipe
    if rc is None:
        return [*lines, f"Recipe: {NOT_MEASURED} (no recipe section in the study).", ""]
    params = ", ".join(f"{k} {fmt_plain(v)}" for k, v in rc.calibrator_params.items()) or "none"
    lines += [
        f"Recipe {code(rc.name)} from {code(rc.source)} (sha256 {code(rc.sha256)}): "
        f"{rc.description}",
        "",
        f"- Format: {code(rc.format)}; weight scales: {rc.weight_granularity.replace('_', '-')} "
        f"of the {'BatchNorm-folded' if rc.fold_bn else 'unfolded'} weights"
        f"{BIAS_CORRECTION if rc.bias_correction else ''}"
        f"{_rounding(rc)}; activations: "
        f"{_row_scales(rc) if rc.activation_granularity == 'per_row' else ''}"
        f"static per-tensor scales from the {code(rc.calibrator)} calibrator (parameters: "
        f"{params}){' and per-layer overrides' if rc.layer_calibrators else ''}"
        f"{', scale migration ' + rc.migration if rc.migration != 'none' else ''}"
        f"{f', headroom x{fmt_plain(rc.headroom)}' if rc.headroom != 1.0 else ''}"
        f"{'; GELU: erf only (no backend runs its tanh form)' if rc.gelu == 'erf' else ''}.",
    ]
    fp8 = r.engine(FP8)
    if fp8 is None:
        lines.append(f"- FP8 engine: {NOT_MEASURED} (no fp8 engine in the study).")
        real: set[str] = set()
        emulated: set[str] = set()
        stepped: frozenset[str] = frozenset()
        other = "no FP8 engine"
    else:
        other = fp8.compute_dtype
        real, emulated = set(fp8.fp8_real), set(fp8.fp8_emulated)
        stepped = frozenset(fp8.layout.stepped_aside)
        lines.append(
            f"- Ran FP8 for real (FP8 matrix products): {len(fp8.fp8_real)} of "
            f"{len(rc.selected)} selected layers."
        )
        emu = (
            f"- Emulated (quantize-dequantize, no FP8 kernel): {len(fp8.fp8_emulated)} of "
            f"{len(rc.selected)} selected layers"
        )
        if 0 < len(fp8.fp8_emulated) <= COLLAPSE_ROWS:
            emu += ": " + ", ".join(code(n) for n in fp8.fp8_emulated)
        lines.append(emu + ".")
        if fp8.layout.stepped_aside:
            aside = (
                f"- Kept in {fp8.compute_dtype} by the per-layer kernel choice (FP8 slower at "
                f"every timed batch, `engines/step_aside.py`): {len(fp8.layout.stepped_aside)} of "
                f"{len(rc.selected)} selected layers"
            )
            if len(fp8.layout.stepped_aside) <= COLLAPSE_ROWS:
                aside += ": " + ", ".join(code(n) for n in fp8.layout.stepped_aside)
            lines.append(aside + ".")
        lines.append(
            f"- Stayed in {fp8.compute_dtype}: {fp8.fp16_layers} conv/linear layers of the FP8 "
            "engine."
        )
    lines.append("")
    if rc.counts:
        lines += table(["Layer class", "Layers"], [[k, str(v)] for k, v in rc.counts.items()])
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
    sel = table(header, _layer_rows(rc.selected, real, emulated, other, stepped))
    lines += [f"Selected layers ({len(rc.selected)}):", ""]
    lines += maybe_collapsed(f"{len(rc.selected)} selected layers", sel, len(rc.selected))
    exc = table(header, _layer_rows(rc.excluded, set(), set(), other))
    lines += [f"Excluded candidates ({len(rc.excluded)}), each with its rule and reason:", ""]
    lines += maybe_collapsed(f"{len(rc.excluded)} excluded candidates", exc, len(rc.excluded))
    return lines
