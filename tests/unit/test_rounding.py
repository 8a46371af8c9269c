"""Compensating FP8 weight rounding against nearest and against a brute-force optimum."""

import itertools

import pytest
import torch
from torch import nn

from quantstudy.quant.fitting.rounding import (
    SEARCHED,
    Search,
    candidate_scales,
    compensate,
    fp8_weights,
    output_error,
    round_weight,
    to_grid,
)
from quantstudy.quant.formats.fp8 import E4M3, dequantize_weight, quantize_weight, weight_scale

# The FP8 E4M3 grid, for the brute force: every finite value the format holds.
GRID = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
GRID = torch.unique(GRID[torch.isfinite(GRID)])


def _correlated_moment(k: int, seed: int) -> torch.Tensor:
    """E[x x^T] of inputs with strongly correlated channels (shared factors, a mean)."""
    g = torch.Generator().manual_seed(seed)
    factors = torch.randn(4000, 2, generator=g, dtype=torch.float64)
    mix = torch.randn(2, k, generator=g, dtype=torch.float64)
    x = factors @ mix + 0.1 * torch.randn(4000, k, generator=g, dtype=torch.float64) + 1.0
    return x.t() @ x / len(x)


def _brute_force(
    w: torch.Tensor, scale: torch.Tensor, h: torch.Tensor, also: torch.Tensor, steps: int = 3
) -> torch.Tensor:
    """Per row, the minimum of (w - q) H (w - q)^T over every q whose entries each lie within
    `steps` FP8 grid values of the weight's nearest one (or equal `also`'s entry)."""
    best = []
    for row, s, extra in zip(w, scale, also, strict=True):
        options = []
        for v, e in zip(row / s, extra / s, strict=True):
            i = int(torch.argmin((GRID - v).abs()))
            near = GRID[max(i - steps, 0) : i + steps + 1].tolist()
            options.append(sorted(set(near) | {float(e)}))
        combos = torch.tensor(list(itertools.product(*options)), dtype=torch.float64) * s
        best.append(float(output_error(row.expand_as(combos), combos, h).min()))
    return torch.tensor(best, dtype=torch.float64)


def _dequant(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize_weight(w8, scale, torch.float32).double()


@pytest.mark.parametrize("seed", range(5))
def test_compensating_between_brute_force_and_nearest(seed):
    g = torch.Generator().manual_seed(100 + seed)
    w = torch.randn(6, 5, generator=g)
    h = _correlated_moment(5, seed)
    near = _dequant(*quantize_weight(w, True))
    comp = _dequant(*round_weight(w, True, h))
    e_near, e_comp = output_error(w, near, h), output_error(w, comp, h)
    best = _brute_force(w.double(), weight_scale(w, True).double(), h, comp)
    assert torch.all(e_comp <= e_near)  # never worse than nearest, row by row
    assert torch.all(e_comp >= best * (1 - 1e-9))  # the brute force is the optimum
    # it buys a real share of what the optimum buys over nearest
    assert float((e_near - e_comp).sum()) >= 0.3 * float((e_near - best).sum())


def test_compensating_equals_nearest_when_moment_is_diagonal():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 24, generator=g)
    h = torch.diag(torch.rand(24, generator=g, dtype=torch.float64) + 0.1)
    for per_channel in (True, False):
        w8, scale = round_weight(w, per_channel, h)
        n8, nscale = quantize_weight(w, per_channel)
        assert torch.equal(w8.view(torch.uint8), n8.view(torch.uint8))
        assert torch.equal(scale, nscale)


def test_compensating_keeps_the_scale_and_saturates():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 64, generator=g)
    w8, scale = round_weight(w, True, _correlated_moment(64, 4))
    assert torch.equal(scale, weight_scale(w, True))
    assert w8.dtype == E4M3 and torch.isfinite(w8.float()).all()
    assert float(w8.float().abs().max()) <= 448


def test_compensating_cuts_output_error_on_correlated_inputs():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 96, generator=g)
    h = _correlated_moment(96, 5)
    e_near = output_error(w, _dequant(*quantize_weight(w, True)), h).sum()
    e_comp = output_error(w, _dequant(*round_weight(w, True, h)), h).sum()
    assert e_comp < 0.5 * e_near


def test_fp8_weights_rounds_pointwise_layers_only():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 3), nn.Linear(16, 4))
    moments = {"0": _correlated_moment(8, 0), "2": _correlated_moment(16, 1)}
    out = fp8_weights(model, ["0", "1", "2"], True, "compensating", moments)
    for name in ("0", "1", "2"):
        layer = model.get_submodule(name)
        assert out[name][0].shape == layer.weight.shape
    n8, _ = quantize_weight(model[1].weight.detach(), True)
    assert torch.equal(out["1"][0].view(torch.uint8), n8.view(torch.uint8))  # 3x3: nearest
    with pytest.raises(KeyError, match="second moment"):
        fp8_weights(model, ["0"], True, "compensating", {})


# --- the searches: scale candidates and refinement sweeps (quant/fitting/rounding.py) ---


def _coordinate_minimum(w, q, scale, h) -> bool:
    """Whether no single weight of `q` can move to another FP8 value and lower its row's
    output error: what refinement sweeps run to convergence must leave."""
    base = output_error(w, q, h)
    for j in range(q.shape[1]):
        for row in range(q.shape[0]):
            s = scale[row] if scale.dim() else scale
            for v in GRID:
                trial = q[row : row + 1].clone()
                trial[0, j] = v * s
                if output_error(w[row : row + 1], trial, h)[0] < base[row] * (1 - 1e-12):
                    return False
    return True


def _exact(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The stored weight in float64, without float32's rounding of the product: the values the
    searches compare (a float32 product moves an error by parts in 10^7)."""
    return w8.double() * (scale.double()[:, None] if scale.dim() else scale.double())


@pytest.mark.parametrize("seed", range(3))
def test_refinement_never_raises_the_error_and_ends_at_a_coordinate_minimum(seed):
    g = torch.Generator().manual_seed(200 + seed)
    w = torch.randn(4, 6, generator=g)
    h = _correlated_moment(6, seed)
    comp = _exact(*round_weight(w, True, h))
    refined = _exact(*round_weight(w, True, h, Search(sweeps=50)))
    e_comp, e_ref = output_error(w, comp, h), output_error(w, refined, h)
    assert torch.all(e_ref <= e_comp * (1 + 1e-12))
    assert _coordinate_minimum(w.double(), refined, weight_scale(w, True).double(), h)
    best = _brute_force(w.double(), weight_scale(w, True).double(), h, refined)
    assert torch.all(e_ref >= best * (1 - 1e-9))  # the brute force is still the optimum


def test_refinement_moves_nothing_when_moment_is_diagonal():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(16, 24, generator=g)
    h = torch.diag(torch.rand(24, generator=g, dtype=torch.float64) + 0.1)
    w8, scale = round_weight(w, True, h, Search(sweeps=5))
    n8, nscale = quantize_weight(w, True)
    assert torch.equal(w8.view(torch.uint8), n8.view(torch.uint8))
    assert torch.equal(scale, nscale)


@pytest.mark.parametrize("per_channel", [True, False])
def test_scale_candidates_pick_the_smallest_error_among_their_scales(per_channel):
    """Each channel's (or the tensor's) result equals the best of rounding separately on every
    candidate scale, and its stored scale is one of those candidates."""
    g = torch.Generator().manual_seed(8)
    w = torch.randn(12, 20, generator=g)
    h = _correlated_moment(20, 8)
    w8, scale = round_weight(w, per_channel, h, Search(scales=8))
    got = output_error(w, _exact(w8, scale), h)
    base = weight_scale(w, per_channel)
    errors = []
    for k, cand in enumerate(candidate_scales(base, 8)):
        assert torch.equal(cand, base if k == 0 else (base * 2.0 ** (k / 8)).float())
        view = cand.reshape(-1, 1) if per_channel else cand
        near = to_grid(w.double(), view.double())
        comp = compensate(w, h, view)
        errors.append(torch.minimum(output_error(w, near, h), output_error(w, comp, h)))
    errors = torch.stack(errors)
    if per_channel:
        assert torch.allclose(got, errors.min(0).values, rtol=1e-12, atol=0)
        ratios = scale / base
    else:
        assert float(got.sum()) == pytest.approx(float(errors.sum(1).min()), rel=1e-12)
        ratios = (scale / base).reshape(1)
    steps = torch.log2(ratios.double()) * 8
    assert torch.allclose(steps, steps.round(), atol=1e-4)  # k / 8 octave, k in 0..7
    assert float(steps.min()) > -1e-4 and float(steps.max()) < 7.5
    assert float(w8.float().abs().max()) <= 448  # amax never clipped: it lands in (224, 448]


def test_scale_candidates_cut_the_output_error_of_narrow_layers():
    """Few input channels leave little to compensate; a better-placed grid still helps."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(64, 16, generator=g)
    h = _correlated_moment(16, 9)
    plain = output_error(w, _exact(*round_weight(w, True, h)), h).sum()
    searched = output_error(w, _exact(*round_weight(w, True, h, SEARCHED)), h).sum()
    assert searched < 0.85 * plain


def test_searches_need_the_second_moment_and_sane_counts():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="second moment"):
        round_weight(w, True, None, Search(scales=4))
    with pytest.raises(ValueError, match="scale candidates must be >= 1"):
        Search(scales=0)
    with pytest.raises(ValueError, match="sweeps >= 0"):
        Search(sweeps=-1)
