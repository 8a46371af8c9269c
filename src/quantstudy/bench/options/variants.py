"""The FP8 quality-option variants `quantstudy bench options` can compare, by name.

Each variant is a set of changes to the recipe's own `QuantOptions` (`record/quant_options.py`); the
recipe's layer selection is never changed, so a row of the table says what its options buy
on the same layers. Names are built from the parts they combine, so a reader of the table
knows a row's options without opening this file.
"""

from __future__ import annotations

import warnings
from typing import Any

from quantstudy.quant.calibration.calibrate import HEADROOM_TRIED
from quantstudy.quant.fitting.rounding import SEARCHED
from quantstudy.record.vocab import Calibrator, Migration, Rounding, Tuning

# name -> changes to the recipe's options; `layer_calibrators: "choose"` is resolved per layer
# by `quant.calib_choice.choose_calibrators` on the calibration images.
VARIANTS: dict[str, dict[str, Any]] = {
    "nearest": {"rounding": Rounding.NEAREST, "bias_correction": False},
    "nearest + bias correction": {"rounding": Rounding.NEAREST, "bias_correction": True},
    "compensating": {"rounding": Rounding.COMPENSATING, "bias_correction": False},
    "compensating + bias correction": {"rounding": Rounding.COMPENSATING, "bias_correction": True},
    "compensating + bc + per-row scales": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "row_scales": True,
    },
    "nearest + bc + per-row scales": {
        "rounding": Rounding.NEAREST,
        "bias_correction": True,
        "row_scales": True,
    },
    "compensating + bc + per-row scales + smooth migration": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "row_scales": True,
        "migration": Migration.SMOOTH,
    },
    "propagated nearest + bias correction": {
        "rounding": Rounding.NEAREST,
        "bias_correction": True,
        "propagated": True,
    },
    "propagated compensating + bias correction": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "propagated": True,
    },
    "propagated nearest + bc + per-row scales": {
        "rounding": Rounding.NEAREST,
        "bias_correction": True,
        "row_scales": True,
        "propagated": True,
    },
    "propagated compensating + bc + per-row scales": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "row_scales": True,
        "propagated": True,
    },
    "propagated compensating + bc + smooth migration": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "propagated": True,
    },
    "propagated compensating + bc + per-layer calibrators": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "layer_calibrators": "choose",
        "propagated": True,
    },
    "propagated compensating + bc + mse calibrator": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "calibrator": Calibrator.MSE,
        "propagated": True,
    },
    "propagated compensating + bc + percentile calibrator": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "calibrator": Calibrator.PERCENTILE,
        "params": {"percentile": 99.99},
        "propagated": True,
    },
    "propagated compensating + bc + smooth migration + mse calibrator": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "calibrator": Calibrator.MSE,
        "propagated": True,
    },
    "propagated compensating + bc + smooth migration + per-layer calibrators": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "layer_calibrators": "choose",
        "propagated": True,
    },
    "nearest + bc + tuned biases": {
        "rounding": Rounding.NEAREST,
        "bias_correction": True,
        "tune": Tuning.BIAS,
    },
    "nearest + bc + tuned scales and biases": {
        "rounding": Rounding.NEAREST,
        "bias_correction": True,
        "tune": Tuning.SCALE_BIAS,
    },
    "propagated compensating + bc + smooth migration + tuned biases": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "propagated": True,
        "tune": Tuning.BIAS,
    },
    "propagated compensating + bc + smooth migration + tuned biases, 30 epochs": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "propagated": True,
        "tune": Tuning.BIAS,
        "tune_epochs": 30,
    },
    "propagated compensating + bc + smooth migration + tuned scales and biases": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
        "propagated": True,
        "tune": Tuning.SCALE_BIAS,
    },
    "compensating + bc + per-layer calibrators": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "layer_calibrators": "choose",
    },
    "compensating + bc + smooth migration": {
        "rounding": Rounding.COMPENSATING,
        "bias_correction": True,
        "migration": Migration.SMOOTH,
    },
}

# The propagated fit with migration, the base of the searches and per-row variants below;
# `generic_pointwise_propagated` itself is `f"{_NO_MIGRATION} + scale search + refinement +
# headroom 4"` (its recipe file says why migration is left out).
_BUILT_IN = "propagated compensating + bc + smooth migration"
# Compensating rounding's searches (quant/fitting/rounding.py), on their own and together.
_SEARCHES = {
    "scale search": {"scale_candidates": SEARCHED.scales},
    "refinement": {"refine_sweeps": SEARCHED.sweeps},
    "scale search + refinement": {
        "scale_candidates": SEARCHED.scales,
        "refine_sweeps": SEARCHED.sweeps,
    },
}
_NO_MIGRATION = "propagated compensating + bias correction"
for _base in ("compensating + bias correction", _BUILT_IN, _NO_MIGRATION):
    for _label, _change in _SEARCHES.items():
        VARIANTS[f"{_base} + {_label}"] = {**VARIANTS[_base], **_change}
# Headroom above the calibrated amax (recipe schema, `activations.headroom`), alone and with the
# rounding searches.
for _base in (
    "compensating + bias correction",
    "compensating + bc + smooth migration",
    _BUILT_IN,
    f"{_BUILT_IN} + scale search + refinement",
    f"{_NO_MIGRATION} + scale search + refinement",  # the built-in recipe less migration
):
    VARIANTS[f"{_base} + headroom 4"] = {**VARIANTS[_base], "headroom": HEADROOM_TRIED}
VARIANTS[f"{_BUILT_IN} + per-row scales"] = {**VARIANTS[_BUILT_IN], "row_scales": True}
# Per-row scales on narrow inputs only, where a row's own scale gains most (docs/fp8-options.md).
for _width in (48, 112, 320):
    VARIANTS[f"{_BUILT_IN} + per-row scales on inputs <= {_width} channels"] = {
        **VARIANTS[_BUILT_IN],
        "row_scales": True,
        "row_max_channels": _width,
    }

# The fit's former name: the committed option records key their rows by these labels
# (docs/fp8-options.md, "What it measured on EfficientNet-Lite0"), so an old label still reads,
# with a warning.
RENAMED: dict[str, str] = {
    "sequential " + name.removeprefix("propagated "): name
    for name in VARIANTS
    if name.startswith("propagated ")
}


def variant_name(label: str) -> str:
    """The current name of the variant `label`, an old "sequential ..." label mapped to its
    "propagated ..." name with a DeprecationWarning; any other label is returned as given."""
    new = RENAMED.get(label)
    if new is None:
        return label
    warnings.warn(
        f"option variant '{label}' is now named '{new}'", DeprecationWarning, stacklevel=2
    )
    return new
