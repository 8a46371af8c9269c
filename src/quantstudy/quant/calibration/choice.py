"""Per-layer calibrator choice: for each quantized tensor, the calibrator whose clip gives its
readers the smallest output error on the calibration images.

Each candidate calibrator (max, percentile, mse, entropy with their default parameters) gives
every tensor an amax. For a tensor read by layers L_i, the cost of an amax a is the mean square
of W_i (q_a(x) - x) summed over its readers, over the positions of the calibration images (a
seeded sample of `rows_per_batch` rows per batch), with q_a the FP8 quantize-dequantize at
scale a/448 and W_i the layer's float weight (exact for linears and 1x1 convs; a kxk conv's taps
are summed, as if each read the same pixel). That is the error the activation quantizer adds to
the readers' outputs, the thing a calibrator's own objective (on x alone) only stands in for: a
clip that saturates a few large inputs can cost more at the output than it saves in resolution,
or less. Ties keep the recipe's
calibrator. Costs one calibration pass per candidate plus one scoring pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from quantstudy.quant.calibration.calibrate import Calibration, calibrate
from quantstudy.quant.formats.fp8 import E4M3_MAX, fake_quant
from quantstudy.quant.graph.trace import PreHook, pre_hooks
from quantstudy.record.vocab import Calibrator, choices

CANDIDATES = tuple(choices(Calibrator))


def choose_calibrators(
    model: nn.Module,
    layers: list[str],
    batches: Callable[[], Iterable[torch.Tensor]],
    default: str = Calibrator.MAX,
    candidates: tuple[str, ...] = CANDIDATES,
    rows_per_batch: int = 4096,
) -> dict[str, str]:
    """layer -> calibrator for every layer whose tensor is better served by another calibrator
    than `default` (its consumers all get the same one); the `layer_calibrators` of a recipe."""
    cals = {name: calibrate(model, layers, batches(), name) for name in candidates}
    base = cals[default]
    costs = _output_costs(
        model, base, {n: c.amax for n, c in cals.items()}, batches(), rows_per_batch
    )
    chosen: dict[str, str] = {}
    for key, consumers in base.groups.items():
        best = min(candidates, key=lambda n: (costs[key][n], n != default))
        if best != default:
            chosen.update({layer: best for layer in consumers})
    return chosen


def _output_costs(
    model: nn.Module,
    base: Calibration,
    amaxes: dict[str, dict[str, float]],
    batches: Iterable[torch.Tensor],
    rows_per_batch: int,
) -> dict[str, dict[str, float]]:
    """tensor key -> calibrator -> summed output mean square error of its readers."""
    costs = {key: dict.fromkeys(amaxes, 0.0) for key in base.groups}
    g = torch.Generator().manual_seed(0)

    def hook(key: str) -> PreHook:
        readers = [model.get_submodule(n) for n in base.groups[key]]

        def score(_m: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
            x = inp[0].detach().float()
            rows = x.movedim(1, -1) if isinstance(readers[0], nn.Conv2d) else x
            rows = rows.reshape(-1, rows.shape[-1])
            pick = torch.randint(
                0, rows.shape[0], (min(rows_per_batch, rows.shape[0]),), generator=g
            )
            rows = rows[pick.to(rows.device)]
            for name, amax in amaxes.items():
                scale = torch.tensor(amax[key] / E4M3_MAX, device=rows.device)
                err = fake_quant(rows, scale) - rows
                costs[key][name] += sum(float(_through(r, err).pow(2).mean()) for r in readers)

        return score

    with pre_hooks(model, [(k, hook(k)) for k in base.groups]), torch.no_grad():
        for batch in batches:
            model(batch)
    return costs


def _through(layer: nn.Module, err: torch.Tensor) -> torch.Tensor:
    """The layer's weight applied to input-error rows (bias-free), each tap of a kxk conv alike."""
    w = layer.weight.detach().float()
    if isinstance(layer, nn.Conv2d):
        g = layer.groups
        w = w.sum(dim=(2, 3))  # (out, in / groups): rows carry one pixel's channels
        if g > 1:
            e = err.reshape(err.shape[0], g, -1)
            return torch.einsum("rgi,goi->rgo", e, w.reshape(g, -1, w.shape[1])).flatten(1)
    return err @ w.t()
