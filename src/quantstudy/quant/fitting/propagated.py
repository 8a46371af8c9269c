"""Propagated FP8 weight fitting (a recipe's `weights.propagated`): each layer's stored weights and
bias fitted, in execution order, to what the fp32 network computes there, from the input the
partly quantized network gives it, so the error of every earlier FP8 layer propagates into the fit.

Rounding and bias correction computed from the fp32 network (`quant/fitting/rounding.py`,
`quant/fitting/bias_correction.py`) fix each layer's own weight error as if its input were exact. In
an FP8 network it is not: every earlier FP8 layer rounds its input activations and weights, and the
nonlinearities between them turn that zero-mean noise into shifts that add up over the depth.
Fitting layer by layer, each from the input the partly quantized network gives it, sees them
(the error propagated through the earlier FP8 layers, hence the name). For each selected layer
L, in the order the forward pass first reaches them:

1. The calibration images run through two copies of the BatchNorm-folded float32 model: the
   reference, and the working copy whose earlier selected layers are already their fitted FP8
   emulation (`QDQ`, the recipe's weights and activation quantization). At L both stop; L's
   input is captured as the reference reads it (x) and as L's own input quantizer leaves it in
   the working copy (x~: the migration divisor applied, then FP8 with the static or per-row
   scale). Strided 1x1 convs see only the positions they read.
2. Weights. A linear or dense 1x1 conv with `compensating` rounding is rounded as
   `quant/fitting/rounding.py` rounds (GPTQ's procedure on the per-channel FP8 grid, its per-row
   guard) under H~ = E[x~ x~^T], the second moment of the input it will really see, instead of the
   fp32 network's. The float target stays W: the least-squares weight for the reference output from
   the quantized input, W E[x x~^T] H~^-1 (GPTAQ's asymmetric target, Li et al., 2025), shrinks
   each output towards zero to cut the noise power, which lowers the mean square error but
   scales the logits; on EfficientNet-Lite0 it raised the KL mean, so it is not used. With
   `nearest` rounding, and for other layers, the weight is rounded to nearest, unchanged.
3. Bias (with bias correction). The mean that the next layer sees is matched to the
   reference's. Where an elementwise activation consumes the layer's output alone
   (`quant/rewrites/absorb.py` finds it, e.g. the ReLU6 of a folded BatchNormAct), the mean after
   the activation: the shift s per output channel solves mean(act(Q x~ + b - s)) =
   mean(act(W x + b)) over a seeded sample of `SAMPLE_ROWS` positions per batch, paired across
   the two networks (`bias_shift`). Matching before the activation instead moves channels that
   the activation cuts off, and made Lite0's KL mean worse than no propagated fit at all.
   Elsewhere the mean output itself: b - (Q E[x~] - W E[x]) over every position (for a kxk or
   depthwise conv, from the paired sample of both outputs).

Cost: one forward pass of the calibration images through the network prefix, twice (reference
and working copy), per selected layer: about one calibration pass per selected layer when the
layers spread evenly over the depth. Engines store the fitted weights and biases; speed is
unchanged. The fitted values depend on the calibration images beyond the recorded scales, so a
record alone cannot rebuild them (the TensorRT export refuses such recipes).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from quantstudy.quant.fitting.rounding import PLAIN, Search, compensable, round_weight
from quantstudy.quant.formats.fp8 import quantize_weight
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import pre_hooks
from quantstudy.quant.layers.matmul import QDQ, FP8Weight
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.rewrites.absorb import absorbable_activations
from quantstudy.record.vocab import Rounding


@dataclass(frozen=True)
class Fitted:
    """Stored FP8 weight and float32 bias of every selected layer, fitted layer by layer, for the
    folded float32 model whose weights have `digest` (`QuantPlan.stored_weights` checks it)."""

    weights: dict[str, FP8Weight]
    biases: dict[str, torch.Tensor]
    digest: str


class _Stop(Exception):
    """Raised by the capture hook: the rest of the forward pass is not needed."""


def execution_order(model: nn.Module, layers: list[str], batch: torch.Tensor) -> list[str]:
    """`layers` in the order one forward pass of `batch` first calls them."""
    order: list[str] = []
    hooks = [(n, lambda _m, _i, n=n: order.append(n) if n not in order else None) for n in layers]
    with pre_hooks(model, hooks), torch.no_grad():
        model(batch)
    return order + [n for n in layers if n not in order]


def _prefix_input(model: nn.Module, name: str, batch: torch.Tensor) -> torch.Tensor:
    """The input that `model`'s submodule `name` receives on `batch` (the forward stops there)."""
    seen: list[torch.Tensor] = []

    def hook(_m: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        seen.append(inp[0])
        raise _Stop

    with pre_hooks(model, [(name, hook)]), torch.no_grad(), contextlib.suppress(_Stop):
        model(batch)
    if not seen:
        raise RuntimeError(f"layer {name} did not run in the forward pass")
    return seen[0]


def _positions(t: torch.Tensor) -> torch.Tensor:
    """A conv map (N, C, H, W) or a linear's (..., C) as (positions, C)."""
    t = t.movedim(1, -1) if t.dim() == 4 else t
    return t.reshape(-1, t.shape[-1])


def _rows(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """A pointwise layer's input as (positions, channels), float64: the pixels a 1x1 conv
    reads."""
    if isinstance(layer, nn.Conv2d):
        sh, sw = layer.stride
        x = x[:, :, ::sh, ::sw]
    return _positions(x).double()


class _PairMoments:
    """Running E[x], E[x~] and, when asked, E[x~ x~^T] over positions, float64."""

    def __init__(self, second: bool) -> None:
        self.second = second
        self.h: torch.Tensor | None = None
        self.mx: torch.Tensor | None = None
        self.mq: torch.Tensor | None = None
        self.count = 0

    def collect(self, x: torch.Tensor, xq: torch.Tensor) -> None:
        parts = (xq.t() @ xq if self.second else None, x.sum(0), xq.sum(0))
        if self.mx is None:
            self.h, self.mx, self.mq = parts
        else:
            if self.h is not None:  # collected with `second`
                self.h = self.h + parts[0]
            self.mx, self.mq = self.mx + parts[1], self.mq + parts[2]
        self.count += x.shape[0]

    def moment(self) -> torch.Tensor:
        """E[x~ x~^T] (collected with `second`)."""
        assert self.h is not None  # collected with `second`
        return self.h.cpu() / self.count

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """E[x], E[x~]."""
        assert self.mx is not None and self.mq is not None  # collected at least once
        return self.mx.cpu() / self.count, self.mq.cpu() / self.count


def layer_quant(
    input_quant: Callable[[str, nn.Module], dict[str, Any]], name: str, layer: nn.Module
) -> dict[str, Any]:
    """`input_quant(name, layer)` (`QuantPlan.input_quant`) with its tensors on the layer's
    device."""
    device = layer.weight.device
    return {
        k: v.to(device) if isinstance(v, torch.Tensor) else v
        for k, v in input_quant(name, layer).items()
    }


def emulated(
    layer: nn.Module,
    bias: torch.Tensor,
    x_scale: float,
    per_channel: bool,
    stored: FP8Weight,
    quant: dict[str, Any],
) -> QDQ:
    """The float32 emulation of `layer` with its stored FP8 weight and `bias`, on its device."""
    fitted = copy.deepcopy(layer)
    with torch.no_grad():
        fitted.bias = nn.Parameter(bias.to(layer.weight.device, layer.weight.dtype))
    qdq = QDQ(fitted, FP8LayerSpec(x_scale, per_channel, torch.float32, weight=stored, **quant))
    return cast(QDQ, qdq.to(layer.weight.device))  # Module.to returns the module itself


def fit_pointwise(
    w: torch.Tensor,
    moments: _PairMoments,
    per_channel: bool,
    compensating: bool,
    search: Search = PLAIN,
) -> tuple[FP8Weight, torch.Tensor]:
    """Stored FP8 weight of a pointwise layer's (N, K) weight `w` (module docstring, step 2),
    with compensating rounding's `search`, and its dequantized values Q (N, K), float64."""
    h = moments.moment() if compensating else None
    w8, scale = round_weight(w.float(), per_channel, h, search if compensating else PLAIN)
    view = scale.reshape(-1, 1) if per_channel else scale
    return (w8, scale), w8.double() * view.double()


SAMPLE_ROWS = 4096  # positions per calibration batch kept for the bias fit through an activation


class _Sample:
    """A seeded random subset of positions per batch, the same ones for every tensor."""

    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(0)
        self.parts: dict[str, list[torch.Tensor]] = {}

    def pick(self, rows: int) -> torch.Tensor:
        return torch.randperm(rows, generator=self.gen)[:SAMPLE_ROWS]

    def add(self, key: str, rows: torch.Tensor, idx: torch.Tensor) -> None:
        self.parts.setdefault(key, []).append(rows[idx.to(rows.device)].double().cpu())

    def get(self, key: str) -> torch.Tensor:
        return torch.cat(self.parts[key])


def bias_shift(
    exact: torch.Tensor, rounded: torch.Tensor, act: nn.Module | None, steps: int = 48
) -> torch.Tensor:
    """Per output channel, the shift s that makes the quantized layer's mean output match the
    reference's, from paired samples of both pre-activation outputs (positions, channels).

    Without an activation: mean(rounded) - mean(exact). With an elementwise activation `act`
    that consumes the output, the mean that matters is after it: s solves
    mean(act(rounded - s)) = mean(act(exact)), by bisection over the bracket where, for a
    nondecreasing activation, the root must lie (ReLU, ReLU6; SiLU, GELU and hard-swish are
    nondecreasing over all but a small negative interval). Where the activation is flat over
    the bracket (a channel that never fires), or the means already match, s = 0."""
    if act is None:
        return rounded.mean(0) - exact.mean(0)

    def apply(t: torch.Tensor) -> torch.Tensor:
        return act(t.clone())  # timm's activations may work in place

    with torch.no_grad():
        target = apply(exact).mean(0)
        gap = rounded - exact
        lo, hi = gap.amin(0), gap.amax(0)  # s = lo: rounded - s >= exact everywhere; hi: <=

        def excess(shift: torch.Tensor) -> torch.Tensor:
            return apply(rounded - shift).mean(0) - target

        tol = 1e-9 + 1e-6 * target.abs()
        settled = (excess(torch.zeros_like(lo)).abs() <= tol) | (
            (excess(lo) - excess(hi)).abs() <= tol
        )
        for _ in range(steps):
            mid = (lo + hi) / 2
            above = excess(mid) > 0
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        shift = (lo + hi) / 2
    return torch.where(settled, torch.zeros_like(shift), shift)


def fit_propagated(
    folded: nn.Module,
    layers: list[str],
    batches: Callable[[], Iterable[torch.Tensor]],
    scale_of: Callable[[str], float],
    per_channel: bool,
    rounding: str,
    bias_correction: bool,
    input_quant: Callable[[str, nn.Module], dict[str, Any]],
    digest: str,
    progress: Callable[[str], None] | None = None,
    search: Search = PLAIN,
) -> Fitted:
    """Fit every layer of `layers` of the BatchNorm-folded float32 `folded` in execution order
    (module docstring). `batches()` yields the calibration batches (called twice per layer);
    `scale_of(name)` is a layer's static input scale and `input_quant(name, layer)` its other
    input quantization (`QuantPlan.input_quant`); `search` refines compensating rounding."""
    ref = copy.deepcopy(folded).eval()
    work = copy.deepcopy(folded).eval()
    first = next(iter(batches()))
    order = execution_order(ref, layers, first)
    acts = {
        layer: ref.get_submodule(act)
        for layer, (act, _) in absorbable_activations(ref, layers, first[:1]).items()
    }
    weights: dict[str, FP8Weight] = {}
    biases: dict[str, torch.Tensor] = {}
    for name in order:
        if progress is not None:
            progress(name)
        layer = folded.get_submodule(name)
        quant = layer_quant(input_quant, name, layer)
        divisor = quant.get("x_divisor")
        w = layer.weight.detach().float().cpu()
        if divisor is not None:
            w = w * divisor.float().cpu().reshape((1, -1) + (1,) * (w.dim() - 2))
        probe = QDQ(layer, FP8LayerSpec(scale_of(name), per_channel, torch.float32, **quant))
        pointwise = compensable(layer)
        compensating = Rounding(rounding) is Rounding.COMPENSATING
        moments, sample = _PairMoments(pointwise and compensating), _Sample()
        for batch in batches():
            x = _prefix_input(ref, name, batch)
            xq = probe.quantize_input(_prefix_input(work, name, batch))
            if pointwise:
                if divisor is not None:
                    x = x / divisor.to(x.device, x.dtype).reshape(probe.channel_view(x))
                rows, qrows = _rows(x, layer), _rows(xq, layer)
                moments.collect(rows, qrows)
                idx = sample.pick(rows.shape[0])
                sample.add("x", rows, idx)
                sample.add("xq", qrows, idx)
            else:
                with torch.no_grad():
                    y, yq = _positions(layer(x)), _positions(probe.inner(xq))
                idx = sample.pick(y.shape[0])
                sample.add("y", y, idx)
                sample.add("yq", yq, idx)
        bias = layer.bias.detach().double().cpu() if layer.bias is not None else None
        bias = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else bias
        if pointwise:
            flat = w.reshape(w.shape[0], -1).double()
            (w8, scale), q = fit_pointwise(flat, moments, per_channel, compensating, search)
            stored = (w8.reshape(w.shape), scale)
            exact = sample.get("x") @ flat.t() + bias
            rounded = sample.get("xq") @ q.t() + bias
        else:
            stored = quantize_weight(w, per_channel)
            exact, rounded = sample.get("y"), sample.get("yq")
        act = acts.get(name)
        weights[name] = stored
        if bias_correction and pointwise and act is None:  # exact means over every position
            mx, mq = moments.means()
            bias = bias - (q @ mq - flat @ mx)
        elif bias_correction:
            bias = bias - bias_shift(exact, rounded, act)
        biases[name] = bias.float()
        qdq = emulated(layer, biases[name], scale_of(name), per_channel, stored, quant)
        replace_module(work, name, qdq)
    return Fitted(weights, biases, digest)
