"""Weight bias correction: remove the mean output shift that FP8 weight rounding causes.

Rounding a layer's weights to FP8 moves its output by (Wq - W) x. Its mean over the data,
(Wq - W) E[x], is a per-output-channel constant that does not average out: in depthwise-separable
networks the inputs of the 1x1 convs have large positive means (after ReLU6), and the shift adds
up through the depth of the net. Subtracting it from the bias removes that systematic part and
leaves the zero-mean noise. Order with the recipe's other weight options: scale migration first,
then rounding (nearest or compensating, `quant/fitting/rounding.py`), then this correction for the
shift of the weights so stored. E[x] is the per-channel mean of the layer's input over the
calibration images in the fp32 model (`Calibration.channel_mean`); the correction uses the FP8
weights the engines store (`QuantPlan.stored_weights` of the float32, BN-folded weight), so the FP8
engine and its emulation get the same bias.

On EfficientNet-Lite0 it raises the fp32 emulation's top-1 agreement with fp32 and lowers its
KL; `tests/data/test_fp8_lite0.py` measures the change and prints it.
"""

from __future__ import annotations

import torch
from torch import nn

from quantstudy.quant.calibration.calibrate import Calibration
from quantstudy.quant.formats.fp8 import dequantize_weight, quantize_weight
from quantstudy.quant.layers.matmul import FP8Weight


def output_shift(
    layer: nn.Conv2d | nn.Linear,
    mean: torch.Tensor,
    per_channel: bool,
    fp8_weight: FP8Weight | None = None,
    divisor: torch.Tensor | None = None,
) -> torch.Tensor:
    """(Wq - W) . E[x] per output channel, float64; spatial taps of a kxk conv see the same mean
    (border padding ignored). `fp8_weight`: the stored FP8 weight (default: rounded to nearest);
    with a migration `divisor` d it is that of W diag(d), which reads x / d."""
    w = layer.weight.detach().float().cpu()
    mean = mean.double().cpu()
    if divisor is not None:
        d = divisor.float().cpu()
        w = w * d.reshape((1, -1) + (1,) * (w.dim() - 2))
        mean = mean / d.double()
    w8, scale = fp8_weight if fp8_weight is not None else quantize_weight(w, per_channel)
    delta = (dequantize_weight(w8.cpu(), scale.cpu(), torch.float32).reshape(w.shape) - w).double()
    if isinstance(layer, nn.Linear):
        return delta @ mean
    delta = delta.sum(dim=(2, 3))  # (out, in / groups)
    g = layer.groups
    out, per_group = delta.shape
    grouped = delta.reshape(g, out // g, per_group) @ mean.reshape(g, per_group, 1)
    return grouped.reshape(out)


def correct_biases(
    model: nn.Module,
    layers: list[str],
    calibration: Calibration,
    per_channel: bool,
    weights: dict[str, FP8Weight] | None = None,
    divisors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Subtract each layer's FP8 weight-rounding shift from its bias, in place (float model).

    `weights` are the stored FP8 weights (`QuantPlan.stored_weights`, computed before this
    call, so the correction follows the rounding); default: rounded to nearest."""
    weights, divisors = weights or {}, divisors or {}
    for name in layers:
        layer = model.get_submodule(name)
        if not isinstance(layer, (nn.Conv2d, nn.Linear)):
            continue
        mean = calibration.channel_mean.get(name)
        if mean is None:
            raise KeyError(f"no calibration mean for layer {name}: calibrate it first")
        shift = output_shift(layer, mean, per_channel, weights.get(name), divisors.get(name))
        with torch.no_grad():
            if layer.bias is None:
                zeros = torch.zeros(layer.weight.shape[0], dtype=layer.weight.dtype)
                layer.bias = nn.Parameter(zeros.to(layer.weight.device))
            layer.bias -= shift.to(layer.bias.dtype).to(layer.bias.device)


def set_biases(model: nn.Module, biases: dict[str, torch.Tensor]) -> None:
    """Give each layer of `biases` that bias, in place (a layer without one gets it)."""
    for name, bias in biases.items():
        layer = model.get_submodule(name)
        with torch.no_grad():
            value = bias.to(layer.weight.device, layer.weight.dtype)
            if layer.bias is None:
                layer.bias = nn.Parameter(value.clone())
            else:
                layer.bias.copy_(value)
