"""From a recipe's quantization options and the calibration images to a `QuantPlan`.

One place decides what calibration collects and in which order the options act, so studies,
searches and the quality data tests build the same plan:

1. Calibrate the fp32 model: activation amax per tensor (the recipe's calibrator, or a layer's
   override; times the recipe's headroom, after migration's second calibration), per-channel
   input means (bias correction) and max |x| (migration), and each
   pointwise layer's input second moment when the weights round compensating.
2. Scale migration (`quant/fitting/migrate.py`): divisors from those channel maxima and the
   BatchNorm-folded weights, kept where the float model stays equal; the migrated tensors are
   calibrated again, divided, so their scales fit what the layers quantize.
3. The engines then store the weights migrated, rounded (`quant/fitting/rounding.py`) and, with
   bias correction, correct the bias for the shift of those stored weights
   (`QuantPlan.stored_weights`, `engines/builders.py`); or, with the propagated fit
   (`quant/fitting/propagated.py`), as fitted layer by layer.
4. Output tuning (`quant/fitting/tune.py`), last: the gains and biases of all layers at once, from
   the stored weights and biases of step 3, against the fp32 logits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
from torch import nn

from quantstudy.quant.calibration.calibrate import Calibration, calibrate
from quantstudy.quant.fitting.bias_correction import correct_biases
from quantstudy.quant.fitting.migrate import exact_divisors, smooth_divisors
from quantstudy.quant.fitting.propagated import Fitted, emulated, fit_propagated, layer_quant
from quantstudy.quant.fitting.rounding import compensable
from quantstudy.quant.fitting.tune import Tuned, tune_outputs
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.rewrites.fold import fold_batchnorm
from quantstudy.record.quant_options import QuantOptions
from quantstudy.record.vocab import Migration, Rounding, Tuning


def build_plan(
    model: nn.Module,
    layers: list[str],
    batches: Callable[[], Iterable[torch.Tensor]],
    example: torch.Tensor,
    options: QuantOptions,
) -> QuantPlan:
    """Calibrate the fp32 `model` over `batches()` (called once, twice with migration) and
    return the plan for `layers` under `options` (see the module docstring for the order)."""
    moments = None
    if options.rounding is Rounding.COMPENSATING and not options.propagated:
        moments = [n for n in layers if compensable(model.get_submodule(n))]
    calibration = calibrate(
        model,
        layers,
        batches(),
        options.calibrator,
        options.params,
        second_moments=moments,
        layer_calibrators=options.layer_calibrators,
    )
    divisors: dict[str, torch.Tensor] = {}
    folded = None
    tuned = options.tune is not Tuning.NONE
    if (
        options.migration is Migration.SMOOTH or options.propagated or tuned
    ):  # read deployed weights
        folded = copy.deepcopy(model).cpu().eval()
        if options.fold_bn:
            fold_batchnorm(folded, example.cpu())
    if options.migration is Migration.SMOOTH:
        found = smooth_divisors(folded, layers, calibration, options.migration_alpha)
        divisors = exact_divisors(folded, example.cpu(), found)
        if divisors:
            again = calibrate(
                model,
                layers,
                batches(),
                options.calibrator,
                options.params,
                layer_calibrators=options.layer_calibrators,
                divisors=divisors,
            )
            calibration = replace(calibration, amax=again.amax)
    calibration = calibration.with_headroom(options.headroom)
    plan = _unfitted(layers, calibration, divisors, options)
    if folded is None or not (options.propagated or tuned):
        return plan
    digest = plan.weights_digest(folded)
    device = next(model.parameters()).device  # where the batches are
    if options.propagated:
        fitted = fit_propagated(
            folded.to(device),
            layers,
            batches,
            calibration.scale_of,
            options.per_channel,
            options.rounding,
            options.bias_correction,
            plan.input_quant,
            digest,
            search=plan.search,
        )
    else:
        fitted = Fitted(plan.stored_weights(folded), _stored_biases(plan, folded), digest)
    if not tuned:
        return replace(plan, fitted=fitted)
    t = _tune(plan, model, folded.to(device), batches, fitted, options)
    return replace(plan, fitted=Fitted(t.weights, t.biases, digest), tuned=t)


def _unfitted(
    layers: list[str],
    calibration: Calibration,
    divisors: dict[str, torch.Tensor],
    options: QuantOptions,
) -> QuantPlan:
    """The plan `options` state for `layers`, calibrated, before any fit of its weights."""
    return QuantPlan(
        layers,
        options.per_channel,
        calibration,
        options.bias_correction,
        options.rounding,
        options.row_scales,
        divisors,
        row_max_channels=options.row_max_channels,
        scale_candidates=options.scale_candidates,
        refine_sweeps=options.refine_sweeps,
        gelu=options.gelu,
    )


def _stored_biases(plan: QuantPlan, folded: nn.Module) -> dict[str, torch.Tensor]:
    """Each plan layer's float32 bias as the engines store it without a fit: corrected for the
    stored weights when the recipe asks (`quant/fitting/bias_correction.py`); zeros where none."""
    m = copy.deepcopy(folded)
    if plan.bias_correction:
        weights = plan.stored_weights(folded)
        correct_biases(m, plan.layers, plan.calibration, plan.per_channel, weights, plan.divisors)
    out = {}
    for name in plan.layers:
        layer = m.get_submodule(name)
        bias = layer.bias if layer.bias is not None else torch.zeros(layer.weight.shape[0])
        out[name] = bias.detach().float().cpu()
    return out


def _tune(
    plan: QuantPlan,
    model: nn.Module,
    folded: nn.Module,
    batches: Callable[[], Iterable[torch.Tensor]],
    start: Fitted,
    options: QuantOptions,
) -> Tuned:
    """Step 4 of the module docstring, from the weights and biases `start`."""

    def emulation(name: str, layer: nn.Module, bias: torch.Tensor) -> QDQ:
        quant = layer_quant(plan.input_quant, name, layer)
        scale, stored = plan.calibration.scale_of(name), start.weights[name]
        return emulated(layer, bias, scale, plan.per_channel, stored, quant)

    return tune_outputs(
        model.eval(),
        folded,
        plan.layers,
        batches,
        emulation,
        start.weights,
        start.biases,
        plan.per_channel and options.tune is Tuning.SCALE_BIAS,
        options.tune_epochs,
    )
