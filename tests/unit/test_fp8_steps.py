"""The tests' one-E4M3-step helper (tests/fp8_steps.py) against torch's own E4M3 grid: a bound the
kernel tests rely on must be the grid's spacing, not a share of the value."""

import torch

from tests.fp8_steps import e4m3_step, within_one_e4m3_step


def _grid() -> torch.Tensor:
    """Every non-negative finite E4M3 value, in order (bytes 0x00 to 0x7E; 0x7F is NaN)."""
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def test_the_step_is_the_spacing_of_the_e4m3_grid_at_every_value():
    grid = _grid()
    assert torch.equal(e4m3_step(grid[:-1]), grid[1:] - grid[:-1])
    assert torch.equal(e4m3_step(-grid[:-1]), grid[1:] - grid[:-1])  # the sign does not matter


def test_neighbours_are_one_step_apart_and_the_next_but_one_is_not():
    grid = _grid()
    signed = torch.cat([-grid.flip(0), grid[1:]])  # -448 .. 448, each value once
    assert within_one_e4m3_step(signed[1:], signed[:-1]).all()
    assert not within_one_e4m3_step(signed[2:], signed[:-2]).any()
    # below a power of two a quarter of the larger value spans two steps: 1.0 and 0.875
    assert not within_one_e4m3_step(torch.tensor([0.875]), torch.tensor([1.0])).any()
