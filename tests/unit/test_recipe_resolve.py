"""Resolution semantics on a small hand-built model: order, input sizes, last match wins, errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from quantstudy.recipe.resolve import NO_RULE_REASON, collect_candidates, resolve
from quantstudy.recipe.schema import Recipe, parse_recipe
from quantstudy.record import RecipeInfo
from quantstudy.record.errors import UserError

torch.set_num_threads(1)


class Toy(nn.Module):
    """Registration order differs from call order; one conv never runs; an SE conv on 1x1."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 4)  # registered first, runs last
        self.unused = nn.Conv2d(8, 8, 1)  # never called
        self.pw = nn.Conv2d(8, 8, 1)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.se = nn.Conv2d(8, 8, 1)
        self.tokens = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.stem(x))
        x = self.pw(self.dw(x))
        x = x * self.se(x.mean((2, 3), keepdim=True)).sigmoid()
        t = self.tokens(x.flatten(2).transpose(1, 2))  # (B, H*W, C): tokens
        return self.head(t.mean(1))


EXAMPLE = torch.randn(1, 3, 6, 5)


def recipe(text: str, origin: str = "toy.yaml") -> Recipe:
    return parse_recipe(textwrap.dedent(text).encode(), origin)


def names(decisions) -> list[str]:
    return [d.name for d in decisions]


@pytest.fixture
def toy() -> Toy:
    torch.manual_seed(0)
    return Toy()


def test_candidates_in_forward_order_then_unexecuted(toy):
    cands = collect_candidates(toy, EXAMPLE)
    assert [c.name for c in cands] == ["stem", "dw", "pw", "se", "tokens", "head", "unused"]
    by_name = {c.name: c for c in cands}
    assert by_name["stem"].input_hw == (6, 5)
    assert by_name["se"].input_hw == (1, 1)
    assert by_name["tokens"].input_hw == (30, 1)  # 30 tokens seen as a 30x1 map
    assert by_name["head"].input_hw == (1, 1)  # a (batch, features) vector
    assert by_name["unused"].input_hw is None and not by_name["unused"].executed
    assert by_name["stem"].positions == {"first_conv"}
    assert by_name["se"].positions == {"last_conv"}
    assert by_name["head"].positions == {"last_linear"}
    assert by_name["dw"].group_kind == "depthwise"


def test_subclasses_count_as_candidates():
    class MyConv(nn.Conv2d):
        pass

    model = nn.Sequential(MyConv(3, 4, 1), nn.Flatten(), nn.Linear(4 * 2 * 2, 2))
    cands = collect_candidates(model, torch.randn(1, 3, 2, 2))
    assert [(c.name, c.module_class) for c in cands] == [("0", "MyConv"), ("2", "Linear")]


def test_resolution_leaves_model_state_alone(toy):
    toy.train()
    before = toy.bn.running_mean.clone()
    resolve(recipe("name: r\nrules: [{include: {}}]\n"), toy, EXAMPLE)
    assert toy.training and toy.bn.training
    assert torch.equal(toy.bn.running_mean, before)
    assert all(not m._forward_pre_hooks for m in toy.modules())


def test_everything_starts_excluded(toy):
    res = resolve(recipe("name: r\nrules: [{include: {name_glob: pw}}]\n"), toy, EXAMPLE)
    assert names(res.selected) == ["pw"]
    assert all(d.rule is None and d.reason == NO_RULE_REASON for d in res.excluded)
    assert names(res.excluded) == ["stem", "dw", "se", "tokens", "head", "unused"]


def test_last_matching_rule_wins(toy):
    text = """\
        name: r
        rules:
          - include: {op: conv2d}
            why: all convs
          - exclude: {kernel: 1}
            why: no 1x1
          - include: {name_glob: pw}
            why: but this one
    """
    res = resolve(recipe(text), toy, EXAMPLE)
    decided = {d.name: (d.selected, d.rule, d.reason) for d in res.selected + res.excluded}
    assert decided["stem"] == (True, 0, "all convs")
    assert decided["dw"] == (True, 0, "all convs")
    assert decided["se"] == (False, 1, "no 1x1")
    assert decided["unused"] == (False, 1, "no 1x1")
    assert decided["pw"] == (True, 2, "but this one")
    assert decided["head"] == (False, None, NO_RULE_REASON)
    # The same rules in reverse order decide differently: the order is the semantics.
    reverse = """\
        name: r
        rules:
          - include: {name_glob: pw}
          - exclude: {kernel: 1}
          - include: {op: conv2d}
    """
    res2 = resolve(recipe(reverse), toy, EXAMPLE)
    assert names(res2.selected) == ["stem", "dw", "pw", "se", "unused"]
    assert {d.rule for d in res2.selected} == {2}


def test_default_reason_names_the_rule_when_no_why(toy):
    res = resolve(recipe("name: r\nrules: [{include: {op: linear}}]\n"), toy, EXAMPLE)
    assert {d.reason for d in res.selected} == {"rules[0]: include op=linear"}


def test_input_larger_than_tells_se_apart(toy):
    text = "name: r\nrules: [{include: {op: conv2d, kernel: 1, input_larger_than: 1}}]\n"
    res = resolve(recipe(text), toy, EXAMPLE)
    assert names(res.selected) == ["pw"]  # se runs on 1x1; unused has no known input size


def test_positions(toy):
    text = "name: r\nrules: [{include: {position: [first_conv, last_conv, last_linear]}}]\n"
    assert names(resolve(recipe(text), toy, EXAMPLE).selected) == ["stem", "se", "head"]


def test_counts_by_kind(toy):
    text = "name: r\nrules: [{include: {op: conv2d}}, {exclude: {groups: depthwise}}]\n"
    counts = resolve(recipe(text), toy, EXAMPLE).counts
    assert counts["selected.conv2d.1x1"] == 3  # pw, se, unused
    assert counts["selected.conv2d.kxk"] == 1  # stem
    assert counts["excluded.conv2d.depthwise"] == 1
    assert counts["excluded.linear"] == 2
    assert counts["selected.total"] == 4 and counts["excluded.total"] == 3
    assert counts["candidates.total"] == 7 and counts["candidates.not_executed"] == 1
    kinds = [k for k in counts if k.startswith("selected.") and k != "selected.total"]
    assert sum(counts[k] for k in kinds) == counts["selected.total"]


@pytest.mark.parametrize(
    ("selector", "key"),
    [
        ('{name_glob: ["pw", "blocks.*"]}', "name_glob[1]"),
        ('{name_regex: "p.x"}', "name_regex[0]"),
        ("{stage: layer1}", "stage[0]"),
        ("{module_class: Conv2dSame}", "module_class[0]"),
    ],
)
def test_pattern_matching_nothing_is_an_error_with_its_line(toy, selector, key):
    text = f"name: r\nrules:\n  - include: {{op: conv2d}}\n  - exclude: {selector}\n"
    with pytest.raises(UserError) as info:
        resolve(recipe(text), toy, EXAMPLE)
    message = str(info.value)
    assert message.startswith(f"toy.yaml line 4: rules[1].exclude.{key}:")
    assert "matches no conv2d/linear layer" in message


def test_a_rule_matching_nothing_is_a_note_not_an_error(toy):
    text = "name: r\nrules: [{include: {op: conv2d, kernel: 7}}, {include: {op: linear}}]\n"
    res = resolve(recipe(text), toy, EXAMPLE)
    assert res.notes == ["rules[0] (include op=conv2d kernel=7x7) matched no layer of this model"]


def test_fully_overridden_rule_is_noted(toy):
    text = "name: r\nrules: [{include: {name_glob: pw}}, {exclude: {kernel: 1}}]\n"
    res = resolve(recipe(text), toy, EXAMPLE)
    assert any("rules[0]" in n and "overridden" in n for n in res.notes)


def test_failed_example_pass_is_a_user_error(toy):
    with pytest.raises(UserError, match="example forward pass failed"):
        resolve(recipe("name: r\nrules: [{include: {}}]\n"), toy, torch.randn(1, 4, 6, 5))


def test_to_info_is_the_record_section(toy):
    text = """\
        name: r
        description: toy
        weights: {granularity: per_tensor, fold_bn: false}
        activations: {calibrator: percentile, params: {percentile: 99.9}}
        rules: [{include: {op: conv2d, groups: dense}}]
    """
    rec = recipe(text)
    res = resolve(rec, toy, EXAMPLE)
    info = res.to_info(rec, "toy.yaml")
    assert isinstance(info, RecipeInfo)
    assert info.sha256 == rec.sha256 and info.source == "toy.yaml"
    assert info.weight_granularity == "per_tensor" and info.fold_bn is False
    assert info.calibrator == "percentile" and info.calibrator_params == {"percentile": 99.9}
    assert names(info.selected) == ["stem", "pw", "se", "unused"]
    assert len(info.selected) + len(info.excluded) == info.counts["candidates.total"]
    assert RecipeInfo.model_validate_json(info.model_dump_json()) == info


def test_deterministic(toy):
    rec = recipe("name: r\nrules: [{include: {op: conv2d}}, {exclude: {position: first_conv}}]\n")
    first = resolve(rec, toy, EXAMPLE).to_info(rec, "x").model_dump_json()
    torch.manual_seed(1)
    other = Toy()  # other weights, other example values: same decisions
    second = resolve(rec, other, torch.randn(1, 3, 6, 5)).to_info(rec, "x").model_dump_json()
    assert first == second
