"""The rewrites' check is bit for bit in float (docs/DESIGN.md, `quant/rewrites/`): every rewrite
(absorbed activations, FP8 and padded hand-offs, residual sums, sum hand-offs) keeps a candidate
only where `exact_subset` finds the rewritten float model's output equal to the model's, bit for
bit. A candidate that moves one output by one float32 ulp is dropped; exact ones are kept."""

import torch
from torch import nn

from quantstudy.quant.rewrites.absorb import exact_subset


class _Nudged(nn.Module):
    """`model` whose output moves by one float32 ulp at one element (the candidate "off" chosen),
    or not at all: the smallest change a rewrite could make."""

    def __init__(self, model: nn.Module, off: bool) -> None:
        super().__init__()
        self.model, self.off = model, off

    def forward(self, x):
        y = self.model(x)
        if not self.off:
            return y
        nudged = y.clone()
        nudged[0, 0] = torch.nextafter(y[0, 0], torch.tensor(float("inf")))
        return nudged


def _rewrite(model: nn.Module, chosen: dict[str, str]) -> nn.Module:
    return _Nudged(model, "off" in chosen)


def test_a_rewrite_one_float32_ulp_off_is_dropped_and_the_exact_ones_kept():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    example = torch.randn(2, 8)
    exact = {"fc1": "act1", "fc2": "act2"}
    assert exact_subset(model, example, exact, _rewrite) == exact
    assert exact_subset(model, example, exact | {"off": "act3"}, _rewrite) == exact
    assert exact_subset(model, example, {"off": "act3"}, _rewrite) == {}
