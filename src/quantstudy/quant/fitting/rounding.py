"""FP8 weight rounding: to nearest, or compensating (each rounding error pushed onto the weights
not yet rounded, through the layer's input second moment).

`nearest` rounds every weight to its nearest FP8 E4M3 value on the per-channel (or per-tensor)
scale amax/448 (`fp8.quantize_weight`). It minimises each weight's own error, not the layer's
output error: over many inputs x the output error of one output channel is
(w - q) . x, whose mean square is (w - q) H (w - q)^T with H = E[x x^T], the second moment of the
layer's input channels. When input channels are correlated, errors of like sign on correlated
channels add up.

`compensating` minimises that objective greedily, one input channel (column) at a time, GPTQ's
procedure (Frantar et al., 2023) carried to the FP8 grid:

- Scale: the one `nearest` uses (amax/448 of the float weight; with scale candidates, each
  candidate in turn, below), fixed before rounding, so the stored FP8 weight has the layout
  every engine reads; a weight pushed past +-448 by the updates saturates.
- Damping: H + d I with d = 0.01 x the mean of H's diagonal (`DAMP`), so a channel never seen, or
  two channels that move together, leave the inverse finite.
- Column order: by decreasing H_jj (the channels with most energy rounded first, while the most
  weights are left to absorb their error).
- Update: with U the upper Cholesky factor of (H + d I)^-1 (in that column order), column j is
  rounded to nearest, and its error e_j = (w_j - q_j) / U_jj moves every later column k by
  -e_j U_jk. That is the least-squares optimal change of the not-yet-rounded weights for the error
  just made. Columns are processed in blocks of `BLOCK` (128): updates inside a block are applied
  column by column, to the rest once per block (the same result, fewer passes over the weight).
- Guard: the objective separates over output channels (rows), so each row keeps whichever of its
  nearest and compensated roundings has the smaller (w - q) H (w - q)^T under the undamped H; the
  result is never worse than nearest on that objective, and equals it where H is diagonal (the
  updates are then zero).

Two searches refine `compensating` (recipe fields `weights.scale_candidates` and
`weights.refine_sweeps`; both off by default, both need H, both only lower the objective):

- Scale candidates (n > 1): FP8's grid is relative, so a channel's scale decides where its
  weights fall between grid points, not only the largest one's. Each channel is rounded (nearest
  and compensating) on n scales amax/448 x 2^(k/n), k = 0..n-1 (one octave: every placement of
  the grid, amax never clipped), and keeps the rounding and scale with the smallest output error;
  per-tensor weights keep the scale whose summed error is smallest. The stored scale is the
  chosen one, in float32, as every engine reads it. With n > 1 the result can beat nearest even
  where H is diagonal (a better-placed grid).
- Refinement sweeps (s > 0): coordinate descent on the same objective from the chosen rounding
  (the greedy pass never revisits a column). Over each column in turn, with the others fixed, the
  objective is a parabola in that weight with its minimum at q_j + r_j / H_jj (r = (w - q) H), so
  the nearest FP8 value to it is the best value on the grid; each step keeps or lowers the error,
  and a sweep that changes nothing ends the search. Where H is diagonal, nearest is already that
  optimum and nothing moves.

What each form gains, layer by layer and on the whole network, is measured in
docs/fp8-options.md.

H comes from the calibration images (`calibrate.calibrate(..., second_moments=True)`): the mean of
x x^T over every input position (pixel of a conv's input map, token of a linear's input) of every
calibration image, in the fp32 model. BatchNorm folding changes a conv's weight and bias, not its
input, so the same H serves the folded layer. For 1x1 convs and linears only: a kxk conv's
im2col rows would need H of size (k^2 C)^2; such layers keep nearest rounding.

Cost: collecting H is one K x K product per layer per batch during calibration (float32, summed in
float64); rounding is O(N K^2 + K^3) per layer in float64 on the CPU; each scale candidate
repeats it, and a refinement sweep costs O(N K^2) (seconds on EfficientNet-Lite0:
docs/fp8-options.md, "Weights"). Engines run the stored FP8 weights, so speed is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantstudy.quant.formats.fp8 import E4M3, E4M3_MAX, quantize_weight, weight_scale
from quantstudy.record.vocab import Rounding

DAMP = 0.01
BLOCK = 128


def output_error(weight: torch.Tensor, rounded: torch.Tensor, moment: torch.Tensor) -> torch.Tensor:
    """Per output channel, (w - q) H (w - q)^T: the mean square output error over the inputs
    whose second moment is H. `weight` and `rounded` (N, K) float, `moment` (K, K)."""
    d = weight.double() - rounded.double()
    return ((d @ moment.double()) * d).sum(dim=1)


def to_grid(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Nearest FP8 value of each entry of `w` on `scale` (broadcast), saturating; in w's dtype."""
    code = (w / scale).clamp(-E4M3_MAX, E4M3_MAX).float().to(E4M3)
    return code.to(w.dtype) * scale


def compensate(
    weight: torch.Tensor, moment: torch.Tensor, scale: torch.Tensor, damp: float = DAMP
) -> torch.Tensor:
    """Compensating rounding of `weight` (N, K) on the FP8 grid of `scale` ((N, 1) or scalar),
    for inputs of second moment `moment` (K, K). Returns the rounded values (N, K), float64,
    before the per-row guard (see the module docstring)."""
    w = weight.double().clone()
    h = moment.double().clone()
    scale = scale.double()
    n, k = w.shape
    order = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    w, h = w[:, order], h[order][:, order]
    level = float(torch.diagonal(h).mean())
    h += (damp * level if level > 0 else 1.0) * torch.eye(k, dtype=h.dtype)
    upper = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.empty_like(w)
    for start in range(0, k, BLOCK):
        end = min(start + BLOCK, k)
        errors = torch.empty(n, end - start, dtype=w.dtype)
        for j in range(start, end):
            q[:, j] = to_grid(w[:, j : j + 1], scale)[:, 0]
            e = (w[:, j] - q[:, j]) / upper[j, j]
            w[:, j + 1 : end] -= e[:, None] * upper[j, j + 1 : end][None, :]
            errors[:, j - start] = e
        w[:, end:] -= errors @ upper[start:end, end:]
    out = torch.empty_like(q)
    out[:, order] = q
    return out


def refine(
    weight: torch.Tensor,
    rounded: torch.Tensor,
    moment: torch.Tensor,
    scale: torch.Tensor,
    sweeps: int,
) -> torch.Tensor:
    """Coordinate descent on (w - q) H (w - q)^T per row, from `rounded` (N, K) on the FP8 grid
    of `scale` ((N, 1) or scalar): at most `sweeps` passes over the columns, each column set to
    the grid value nearest its optimum given the others (module docstring). Float64."""
    w, q, h = weight.double(), rounded.double().clone(), moment.double()
    scale = scale.double()
    diag = torch.diagonal(h)
    order = torch.argsort(diag, descending=True, stable=True)
    columns = order[diag[order] > 0].tolist()  # a channel never seen has nothing to fit
    r = (w - q) @ h  # r_j = sum_k (w_k - q_k) H_kj: the objective's half-gradient in q_j, negated
    for _ in range(sweeps):
        moved = False
        for j in columns:
            new = to_grid((q[:, j] + r[:, j] / diag[j])[:, None], scale)[:, 0]
            step = new - q[:, j]
            if bool(step.any()):
                q[:, j] = new
                r -= step[:, None] * h[j][None, :]
                moved = True
        if not moved:
            break
    return q


@dataclass(frozen=True)
class Search:
    """Compensating rounding's searches (module docstring): scale candidates per channel (1:
    amax/448 alone) and coordinate-descent sweeps after the greedy pass (0: none)."""

    scales: int = 1
    sweeps: int = 0

    def __post_init__(self) -> None:
        if self.scales < 1 or self.sweeps < 0:
            raise ValueError(f"scale candidates must be >= 1 and sweeps >= 0, not {self}")

    @property
    def active(self) -> bool:
        return self.scales > 1 or self.sweeps > 0


PLAIN = Search()  # the greedy pass alone, on amax/448
# What the search's option step tries and `generic_pointwise_propagated` uses: 16 candidates
# place the grid every 1/16 octave; 4 sweeps, each O(N K^2), take most of the greedy pass's
# remaining error that refinement removes on Lite0's layers (docs/fp8-options.md), and a sweep
# that moves nothing ends the search early.
SEARCHED = Search(scales=16, sweeps=4)


def candidate_scales(base: torch.Tensor, count: int) -> list[torch.Tensor]:
    """The `count` scales base x 2^(k/count), k = 0..count-1, float32 (k = 0 is `base`)."""
    return [base] + [(base * 2.0 ** (k / count)).float() for k in range(1, count)]


def _guarded(
    w: torch.Tensor, moment: torch.Tensor, view: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the better of nearest and compensating rounding on the grid of `view`, and its
    output error."""
    near = to_grid(w.double(), view.double())
    comp = compensate(w, moment, view)
    err_near, err_comp = output_error(w, near, moment), output_error(w, comp, moment)
    better = err_comp < err_near
    return torch.where(better[:, None], comp, near), torch.where(better, err_comp, err_near)


def round_weight(
    weight: torch.Tensor,
    per_channel: bool,
    moment: torch.Tensor | None = None,
    search: Search = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 weight and its float32 scale, as `fp8.quantize_weight` returns them: rounded to
    nearest without `moment`, compensating with it (2-D weight (N, K), K = moment's size),
    with `search` (module docstring)."""
    if moment is None:
        if search.active:
            raise ValueError("scale candidates and refinement sweeps need the input second moment")
        return quantize_weight(weight, per_channel)
    w = weight.detach().float().cpu()
    moment = moment.cpu()
    rows = w.shape[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # column-sized operations: threads only add hand-over costs
    try:
        best = None
        best_err: torch.Tensor
        best_scale: torch.Tensor
        for scale in candidate_scales(weight_scale(w, per_channel), search.scales):
            view = scale.reshape(-1, 1) if per_channel else scale
            q, err = _guarded(w, moment, view)
            column = view.expand(rows, 1)
            if best is None:
                best, best_err, best_scale = q, err, column
                continue
            if per_channel:
                take = err < best_err
            else:  # one scale for the whole tensor: compare the summed error
                take = torch.full((rows,), bool(err.sum() < best_err.sum()))
            best = torch.where(take[:, None], q, best)
            best_err = torch.where(take, err, best_err)
            best_scale = torch.where(take[:, None], column, best_scale)
        if search.sweeps > 0:
            best = refine(w, best, moment, best_scale, search.sweeps)
    finally:
        torch.set_num_threads(threads)
    scale = best_scale[:, 0].clone() if per_channel else best_scale[0, 0].clone()
    return (best / best_scale.double()).float().to(E4M3), scale


def compensable(layer: nn.Module) -> bool:
    """Whether compensating rounding applies: a linear or a dense 1x1 conv (a product over input
    channels at each position)."""
    if isinstance(layer, nn.Linear):
        return True
    return isinstance(layer, nn.Conv2d) and layer.kernel_size == (1, 1) and layer.groups == 1


def fp8_weights(
    model: nn.Module,
    layers: list[str],
    per_channel: bool,
    rounding: str,
    moments: dict[str, torch.Tensor],
    search: Search = PLAIN,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (FP8 weight in the layer's weight shape, scale) for every layer of `layers` in the
    float32 `model` (BatchNorm already folded where the recipe folds). Compensating rounding
    (with `search`) needs each compensable layer's second moment in `moments`; other layers
    round to nearest."""
    out = {}
    for name in layers:
        layer = model.get_submodule(name)
        w = layer.weight.detach().float().cpu()
        moment = None
        if Rounding(rounding) is Rounding.COMPENSATING and compensable(layer):
            if name not in moments:
                raise KeyError(f"no input second moment for layer {name}: calibrate it first")
            moment = moments[name]
        chosen = search if moment is not None else PLAIN
        w8, scale = round_weight(w.reshape(w.shape[0], -1), per_channel, moment, chosen)
        out[name] = (w8.reshape(w.shape), scale)
    return out
