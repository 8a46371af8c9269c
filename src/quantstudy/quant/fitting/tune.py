"""End-to-end tuning of the FP8 layers' output scales and biases against the fp32 logits.

Rounding, bias correction and the propagated fit (`quant/fitting/rounding.py`, `bias_correction.py`,
`propagated.py`) each fix one layer's own output, from its mean or second moment; none looks at what
the network finally computes. What they leave on a small network is mostly the activations' FP8
rounding noise, which no per-layer statistic removes, and its effect on the logits depends on the
layers after it. This step trains, jointly over all selected layers, each output channel's gain g
(folded into its stored weight scale) and bias b, the FP8 weights themselves fixed, to make the
emulated network's logits match the fp32 network's on the calibration images:

- Objective: KL(fp32 || emulation) of the softmax over classes, the study's own quality measure
  (`quality/metrics.kl_per_image`), averaged over images.
- The emulation is the plan's (`quant/layers/matmul.QDQ`: the stored weights, static or
  per-row input scales, migration divisors); the input quantizers pass the gradient straight
  through inside the FP8 range and none for values they saturate.
- Start: the plan's stored weights and biases (the propagated fit's, or rounded and bias-corrected
  as the recipe asks), g = 1.
- Data: the calibration images, every `HOLDOUT`-th held out. Adam (`LR`), `BATCH` images a step,
  the training images in a seeded order each epoch; after each epoch the held-out KL mean, and
  the parameters that scored lowest on it are kept, the start among them, so the step never
  returns parameters that measured worse on images it did not train on.
- Stored: scale * g per output channel (float32) and b; with per-tensor weight scales the bias
  alone is tuned. Engines store these values, so every engine computes what was tuned and speed
  is unchanged.

Cost: `epochs` forward and backward passes of the training images through the emulation, plus
one forward pass of all calibration images through the fp32 model and one of the held-out ones
per epoch. Like the propagated fit, the values depend on the calibration images beyond the
recorded scales, so a record alone cannot rebuild them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3_MAX
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.matmul import QDQ, FP8Weight

HOLDOUT = 5  # every fifth calibration image checks the tuning instead of training it
LR = 1e-3  # Adam's step, in the units of the gains (about 1) and biases
BATCH = 32


@dataclass(frozen=True)
class Tuned:
    """What tuning changed: the stored weights (scales times gains) and biases, and the held-out
    KL mean before and after (`epoch` 0: the start was kept)."""

    weights: dict[str, FP8Weight]
    biases: dict[str, torch.Tensor]
    heldout_kl: tuple[float, float]
    epoch: int


def _straight_through(qdq: QDQ, x: torch.Tensor) -> torch.Tensor:
    """`qdq`'s input quantization whose gradient is 1 inside the FP8 range, 0 where it clips."""
    base = x
    if qdq.x_divisor is not None:
        base = x / qdq.x_divisor.reshape(qdq.channel_view(x)).to(x.dtype)
    if qdq.x_scale is None:
        return base
    q = qdq.quantize_input(x.detach())
    if qdq.row_scales:
        return q + (base - base.detach())
    inside = (base.detach().abs() <= E4M3_MAX * qdq.x_scale).to(base.dtype)
    return q + (base - base.detach()) * inside


class _Tunable(nn.Module):
    """A selected layer's emulation with a trainable gain and bias per output channel."""

    def __init__(self, qdq: QDQ, bias: torch.Tensor, gain: bool) -> None:
        super().__init__()
        qdq = copy.deepcopy(qdq)
        qdq.inner.bias = None  # the product alone; the bias is this module's parameter
        for p in qdq.parameters():
            p.requires_grad_(False)
        self.qdq = qdq
        self.bias = nn.Parameter(bias.detach().float().clone())
        self.gain = nn.Parameter(torch.ones_like(self.bias)) if gain else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qdq.inner(_straight_through(self.qdq, x))
        view = [1] * y.dim()
        view[1 if self.qdq.is_conv else -1] = -1
        if self.gain is not None:
            y = y * self.gain.reshape(view)
        return y + self.bias.reshape(view)


def _kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) of the softmaxes, mean over rows (P: the fp32 logits)."""
    log_p = torch.log_softmax(ref_logits.float(), dim=1)
    log_q = torch.log_softmax(logits.float(), dim=1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def tune_outputs(
    reference: nn.Module,
    folded: nn.Module,
    layers: list[str],
    batches: Callable[[], Iterable[torch.Tensor]],
    emulation: Callable[[str, nn.Module, torch.Tensor], QDQ],
    weights: dict[str, FP8Weight],
    biases: dict[str, torch.Tensor],
    per_channel: bool,
    epochs: int,
) -> Tuned:
    """Tune the gains and biases of `layers` of the BatchNorm-folded float32 `folded` (module
    docstring) against the fp32 `reference`'s logits. `emulation(name, layer, bias)` is the
    layer's plan emulation with its stored weight and that bias; `weights` and `biases` are the
    start, returned unchanged where the held-out images say tuning did not help."""
    if epochs < 1:
        raise ValueError(f"tuning needs at least one epoch, got {epochs}")
    images = torch.cat(list(batches()))
    device = next(folded.parameters()).device
    gen = torch.Generator().manual_seed(0)
    held = torch.arange(len(images)) % HOLDOUT == HOLDOUT - 1
    if not held.any():
        raise ValueError(
            f"tuning needs at least {HOLDOUT} calibration images (every {HOLDOUT}th checks it), "
            f"got {len(images)}"
        )
    with torch.no_grad():
        ref = torch.cat([reference(b.to(device)).float() for b in images.split(BATCH)])
    work = copy.deepcopy(folded).eval()
    for p in work.parameters():
        p.requires_grad_(False)
    tunables: dict[str, _Tunable] = {}
    for name in layers:
        layer = folded.get_submodule(name)
        qdq = emulation(name, layer, biases[name])
        tunables[name] = _Tunable(qdq, biases[name], per_channel).to(device)
        replace_module(work, name, tunables[name])
    params = [p for t in tunables.values() for p in t.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=LR)

    held_x, held_ref = images[held], ref[held.to(ref.device)]

    def heldout_kl() -> float:
        with torch.no_grad():
            total: float = sum(
                _kl(rb, work(xb.to(device))).item() * len(xb)
                for xb, rb in zip(held_x.split(BATCH), held_ref.split(BATCH), strict=True)
            )
        return total / len(held_x)

    def state() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in work.named_parameters() if v.requires_grad}

    start = heldout_kl()
    best, best_epoch, best_state = start, 0, state()
    train = torch.nonzero(~held).flatten()
    for epoch in range(1, epochs + 1):
        for idx in train[torch.randperm(len(train), generator=gen)].split(BATCH):
            loss = _kl(ref[idx.to(ref.device)], work(images[idx].to(device)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        score = heldout_kl()
        if score < best:
            best, best_epoch, best_state = score, epoch, state()
    out_w, out_b = dict(weights), dict(biases)
    for name in tunables:
        bias = best_state[f"{name}.bias"].cpu()
        out_b[name] = bias
        gain = best_state.get(f"{name}.gain")
        if gain is not None:
            w8, scale = weights[name]
            out_w[name] = (w8, (scale.float() * gain.cpu().float()).contiguous())
    return Tuned(out_w, out_b, (start, best), best_epoch)
