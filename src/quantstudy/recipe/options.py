"""A recipe's quantization options as the plan takes them, and back.

`quant_options` reads the `QuantOptions` the plan is built from out of a validated recipe;
`with_quant_options` writes options (the FP8-option search's choice) back into one, validated
again, so the recipe stays the one place a study's options are stated.
"""

from __future__ import annotations

from quantstudy.recipe.schema import ActivationSpec, Recipe, WeightSpec
from quantstudy.record.quant_options import QuantOptions
from quantstudy.record.vocab import ActivationGranularity, WeightGranularity


def quant_options(recipe: Recipe) -> QuantOptions:
    """The options of a validated recipe."""
    w, a = recipe.weights, recipe.activations
    return QuantOptions(
        per_channel=w.granularity == WeightGranularity.PER_CHANNEL,
        fold_bn=w.fold_bn,
        bias_correction=w.bias_correction,
        rounding=w.rounding,
        scale_candidates=w.scale_candidates,
        refine_sweeps=w.refine_sweeps,
        calibrator=a.calibrator,
        params=dict(a.params),
        row_scales=a.granularity == ActivationGranularity.PER_ROW,
        row_max_channels=a.per_row_max_channels,
        layer_calibrators=dict(a.layer_calibrators),
        migration=a.migration,
        migration_alpha=a.migration_alpha,
        headroom=a.headroom,
        propagated=w.propagated,
        tune=w.tune,
        tune_epochs=w.tune_epochs,
        gelu=recipe.gelu,
    )


def with_quant_options(recipe: Recipe, options: QuantOptions) -> Recipe:
    """The recipe with `options`' fitting and activation choices written into it (validated
    again: a combination the schema refuses raises here)."""
    weights = WeightSpec.model_validate(
        {
            **recipe.weights.model_dump(),
            "rounding": options.rounding,
            "scale_candidates": options.scale_candidates,
            "refine_sweeps": options.refine_sweeps,
            "bias_correction": options.bias_correction,
            "propagated": options.propagated,
            "tune": options.tune,
            "tune_epochs": options.tune_epochs,
        }
    )
    activations = ActivationSpec.model_validate(
        {
            **recipe.activations.model_dump(),
            "layer_calibrators": dict(options.layer_calibrators),
            "migration": options.migration,
            "migration_alpha": options.migration_alpha,
            "headroom": options.headroom,
            "granularity": ActivationGranularity.PER_ROW
            if options.row_scales
            else ActivationGranularity.PER_TENSOR,
            "per_row_max_channels": options.row_max_channels if options.row_scales else None,
        }
    )
    return recipe.model_copy(update={"weights": weights, "activations": activations})
