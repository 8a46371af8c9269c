"""The method section's calibration part: the calibrator, every activation scale and the
tensors that share one, then the recipe's quality options beyond the defaults (how the weights
were fitted, how the activation scales were taken)."""

from __future__ import annotations

from quantstudy.record import RecipeInfo, StudyRecord
from quantstudy.report.format import NOT_MEASURED, code, fmt_plain, fmt_sig, maybe_collapsed, table


def method_calibration(r: StudyRecord) -> list[str]:
    lines = ["### Calibration", ""]
    cal = r.calibration
    if cal is None:
        lines += [f"Calibration: {NOT_MEASURED}.", ""]
    else:
        params = ", ".join(f"{k} {fmt_plain(v)}" for k, v in cal.params.items()) or "none"
        shared = [t for t in cal.tensors if len(t.consumers) > 1]
        lines.append(
            f"Calibrator {code(cal.calibrator)} (parameters: {params}) on {cal.n_images} "
            f"calibration images: {len(cal.tensors)} activation tensors, one static per-tensor "
            "scale each."
        )
        if shared:
            lines.append(
                "Shared scales (one quantizer for several FP8 consumers): "
                + "; ".join(
                    f"{code(t.tensor)} feeds {len(t.consumers)} layers "
                    f"({', '.join(code(x) for x in t.consumers)})"
                    for t in shared
                )
                + "."
            )
        else:
            lines.append("Shared scales: none; every tensor has a single FP8 consumer.")
        lines.append("")
        tt = table(
            ["Tensor", "Consumers", "amax", "scale"],
            [
                [code(t.tensor), ", ".join(t.consumers), fmt_sig(t.amax), fmt_sig(t.scale)]
                for t in cal.tensors
            ],
        )
        lines += maybe_collapsed(f"{len(cal.tensors)} activation scales", tt, len(cal.tensors))
    lines += _options(r)
    return lines


def _options(r: StudyRecord) -> list[str]:
    """The recipe's quality options beyond the defaults (nothing for a default recipe)."""
    rc = r.recipe
    if rc is None:
        return []
    out = [*_weight_options(rc), *_activation_options(rc)]
    return ["", "Quantization options:", "", *out, ""] if out else []


def _weight_options(rc: RecipeInfo) -> list[str]:
    """How the FP8 weights (and biases) were fitted, where not rounded to nearest alone."""
    out = []
    if rc.rounding == "compensating":
        order = (
            "then the bias corrected for the shift of the stored weights"
            if rc.bias_correction
            else "no bias correction"
        )
        out.append(
            "- FP8 weights rounded compensating (`quant/fitting/rounding.py`): input channels one "
            "at a time in decreasing order of their second moment, each rounding error pushed onto "
            "the channels not yet rounded through the inverse of E[x x^T] (the layer's input "
            "over every position of the calibration images, lightly damped), "
            f"per output channel never worse than nearest on that objective; {order}. Every "
            "engine stores these weights."
        )
    if rc.rounding == "compensating" and rc.scale_candidates > 1:
        out.append(
            f"- Each output channel's weights rounded on {rc.scale_candidates} scales spread "
            "evenly (in log) over one octave above its amax-based scale, keeping the scale and "
            "rounding with the smallest output error under the same second moment "
            "(`quant/fitting/rounding.py`); the stored scales are the chosen ones."
        )
    if rc.rounding == "compensating" and rc.refine_sweeps > 0:
        out.append(
            f"- Then up to {rc.refine_sweeps} coordinate-descent sweeps over the input channels: "
            "each weight moved to the FP8 value nearest its optimum given the others, which "
            "never raises that output error."
        )
    if rc.propagated:
        fitted = (
            "the bias fitted so each layer's mean output (after the activation that consumes "
            "it, where one does) matches the fp32 network's"
            if rc.bias_correction
            else "biases unchanged"
        )
        out.append(
            "- Weights and biases set by the propagated fit (`quant/fitting/propagated.py`): "
            "layer by layer in execution order, from the input each layer receives in the "
            "network whose earlier FP8 layers are already quantized (its own activation "
            "quantization included), "
            f"rounded {code(rc.rounding)}; {fitted}. Every engine stores these weights and "
            "biases."
        )
    if rc.tune != "none":
        what = "biases" if rc.tune == "bias" else "biases and per-output-channel gains"
        out.append(
            "- Output tuning (`quant/fitting/tune.py`): the selected layers' "
            f"{what} trained jointly for up to {rc.tune_epochs} epochs against the fp32 network's "
            "logits (KL) on the "
            "calibration images, the FP8 weights fixed; every fifth image held out, the epoch "
            "with its lowest KL kept (the start included). Every engine stores these values."
        )
    return out


def _activation_options(rc: RecipeInfo) -> list[str]:
    """How the activation scales were taken, where not one static amax-based scale each."""
    out = []
    if rc.headroom != 1.0:
        out.append(
            f"- Static activation scales with headroom: each clip value is the calibrator's "
            f"amax x {fmt_plain(rc.headroom)}, so held-out values up to that many times the "
            "calibration images' largest do not saturate; FP8's relative rounding error does "
            "not grow with the scale until values reach E4M3's subnormals. The amax values "
            "above are these clip values."
        )
    if rc.activation_granularity == "per_row":
        which = "pointwise FP8 layers"
        if rc.per_row_max_channels is not None:
            which += f" whose input has at most {rc.per_row_max_channels} channels"
        out.append(
            f"- Activation scales of the {which} computed at run time, one per row "
            "(pixel or token) from its own max |x|; the static scales above serve the other "
            "layers."
        )
    if rc.layer_calibrators:
        chosen = ", ".join(f"{code(k)} {v}" for k, v in rc.layer_calibrators.items())
        out.append(f"- Calibrator per layer, overriding {code(rc.calibrator)}: {chosen}.")
    if rc.migration != "none":
        assert rc.migration_alpha is not None  # recorded with every migration (recipe/resolve.py)
        out.append(
            f"- Scale migration {code(rc.migration)} (alpha {fmt_plain(rc.migration_alpha)}): "
            "SmoothQuant's factor per input channel, the input divided and the weight multiplied "
            "by it where the float model stays equal (`quant/fitting/migrate.py`)."
        )
    return out
