"""Resolve a recipe against the real module graph: which layers are quantized, and why.

Candidates are every module that is an instance of `torch.nn.Conv2d` or `torch.nn.Linear` (timm
subclasses count), in the order one forward pass on an example input calls them; modules the pass
never calls follow in `named_modules` order with `input_hw` None. Everything starts excluded; the
rules apply in order and the last rule whose selector matches a layer decides it (Model Optimizer
semantics), so a recipe reads "include broadly, then carve out exceptions with their reasons".
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from quantstudy.recipe.schema import Recipe
from quantstudy.recipe.selectors import KINDS, PATTERNS, Candidate
from quantstudy.record import LayerDecision, RecipeInfo
from quantstudy.record.errors import UserError

NO_RULE_REASON = "no include rule matched"


@dataclass(frozen=True)
class Resolution:
    """The layer table: every candidate, selected or excluded, with the deciding rule and reason.

    `notes` lists include rules that matched no layer, and rules whose every match a later rule
    overrode: legal, but often a sign that the recipe was written for another model.
    """

    selected: list[LayerDecision]
    excluded: list[LayerDecision]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)
    # every candidate as the selectors saw it, so another recipe resolves without a forward pass
    candidates: list[Candidate] = field(default_factory=list, repr=False)

    @property
    def selected_names(self) -> list[str]:
        return [d.name for d in self.selected]

    def to_info(self, recipe: Recipe, source: str) -> RecipeInfo:
        """The recipe section of the study record; `source` is "builtin:<name>" or a file path."""
        return RecipeInfo(
            name=recipe.name,
            source=source,
            sha256=recipe.sha256,
            description=recipe.description,
            format=recipe.format,
            weight_granularity=recipe.weights.granularity,
            fold_bn=recipe.weights.fold_bn,
            bias_correction=recipe.weights.bias_correction,
            rounding=recipe.weights.rounding,
            scale_candidates=recipe.weights.scale_candidates,
            refine_sweeps=recipe.weights.refine_sweeps,
            propagated=recipe.weights.propagated,
            tune=recipe.weights.tune,
            tune_epochs=recipe.weights.tune_epochs if recipe.weights.tune != "none" else None,
            calibrator=recipe.activations.calibrator,
            calibrator_params=dict(recipe.activations.params),
            activation_granularity=recipe.activations.granularity,
            per_row_max_channels=recipe.activations.per_row_max_channels,
            layer_calibrators=dict(recipe.activations.layer_calibrators),
            migration=recipe.activations.migration,
            migration_alpha=(
                recipe.activations.migration_alpha
                if recipe.activations.migration != "none"
                else None
            ),
            headroom=recipe.activations.headroom,
            gelu=recipe.gelu,
            selected=list(self.selected),
            excluded=list(self.excluded),
            counts=dict(self.counts),
        )


def resolve(recipe: Recipe, model: nn.Module, example: torch.Tensor) -> Resolution:
    """Run one forward pass of `model` on `example` (batch 1 at the model's input size is enough)
    to order the candidates and learn their input sizes, then apply the rules."""
    return apply_rules(recipe, collect_candidates(model, example))


def apply_rules(recipe: Recipe, candidates: list[Candidate]) -> Resolution:
    """The layer table of `recipe` over candidates already collected (`collect_candidates`)."""
    _check_patterns(recipe, candidates)
    matched = [0] * len(recipe.rules)
    decided = [0] * len(recipe.rules)
    selected: list[LayerDecision] = []
    excluded: list[LayerDecision] = []
    counts = {f"{state}.{kind}": 0 for state in ("selected", "excluded") for kind in KINDS}
    for c in candidates:
        winner: int | None = None
        for i, rule in enumerate(recipe.rules):
            if rule.selector.matches(c):
                matched[i] += 1
                winner = i
        if winner is not None:
            decided[winner] += 1
        decision = _decide(recipe, c, winner)
        (selected if decision.selected else excluded).append(decision)
        counts[f"{'selected' if decision.selected else 'excluded'}.{c.kind}"] += 1
    counts["selected.total"] = len(selected)
    counts["excluded.total"] = len(excluded)
    counts["candidates.total"] = len(candidates)
    counts["candidates.not_executed"] = sum(not c.executed for c in candidates)
    notes = _rule_notes(recipe, matched, decided)
    return Resolution(selected, excluded, counts, notes, list(candidates))


def collect_candidates(model: nn.Module, example: torch.Tensor) -> list[Candidate]:
    """Conv2d/Linear modules in forward-call order, with the input size of their first call.

    The pass runs in eval mode under no_grad (BatchNorm statistics are not touched); each
    module's train/eval flag is restored afterwards.
    """
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    calls: dict[int, tuple[int, tuple[int, int] | None]] = {}

    def record(module: nn.Module, args: tuple[object, ...]) -> None:
        if id(module) not in calls:  # a module called twice keeps its first call
            calls[id(module)] = (len(calls), _input_hw(module, args))

    modes = [(m, m.training) for m in model.modules()]
    handles = [m.register_forward_pre_hook(record) for _, m in layers]
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    except (RuntimeError, ValueError, AssertionError, TypeError) as err:
        raise UserError(
            f"the example forward pass failed for an input of shape {tuple(example.shape)}: "
            f"{err}; pass an example at the model's input size, e.g. (1, 3, H, W)"
        ) from err
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.train(training)
    executed = sorted((calls[id(m)][0], n, m) for n, m in layers if id(m) in calls)
    ordered = [(n, m) for _, n, m in executed] + [(n, m) for n, m in layers if id(m) not in calls]
    positions = _positions([(n, m) for _, n, m in executed])
    return [
        _candidate(i, n, m, calls.get(id(m)), positions.get(n, frozenset()))
        for i, (n, m) in enumerate(ordered)
    ]


def _input_hw(module: nn.Module, args: tuple[object, ...]) -> tuple[int, int] | None:
    """Conv: H x W of the input. Linear: the map its rows come from (see `Candidate`)."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None:
        return None
    if isinstance(module, nn.Conv2d):
        return (int(x.shape[-2]), int(x.shape[-1])) if x.dim() >= 3 else None
    inner = [int(s) for s in x.shape[1:-1]]
    if len(inner) == 2:
        return (inner[0], inner[1])
    return (math.prod(inner), 1)  # () -> (1, 1): a vector is a 1x1 map; tokens -> (T, 1)


def _positions(executed: list[tuple[str, nn.Module]]) -> dict[str, frozenset[str]]:
    convs = [n for n, m in executed if isinstance(m, nn.Conv2d)]
    linears = [n for n, m in executed if isinstance(m, nn.Linear)]
    marks: dict[str, set[str]] = {}
    if convs:
        marks.setdefault(convs[0], set()).add("first_conv")
        marks.setdefault(convs[-1], set()).add("last_conv")
    if linears:
        marks.setdefault(linears[-1], set()).add("last_linear")
    return {n: frozenset(s) for n, s in marks.items()}


def _candidate(
    index: int,
    name: str,
    m: nn.Module,
    call: tuple[int, tuple[int, int] | None] | None,
    positions: frozenset[str],
) -> Candidate:
    hw = call[1] if call is not None else None
    if isinstance(m, nn.Conv2d):
        return Candidate(
            index=index,
            name=name,
            op="conv2d",
            module_class=type(m).__name__,
            kernel=(int(m.kernel_size[0]), int(m.kernel_size[1])),
            stride=(int(m.stride[0]), int(m.stride[1])),
            groups=int(m.groups),
            in_channels=int(m.in_channels),
            out_channels=int(m.out_channels),
            input_hw=hw,
            executed=call is not None,
            positions=positions,
        )
    return Candidate(
        index=index,
        name=name,
        op="linear",
        module_class=type(m).__name__,
        kernel=None,
        stride=None,
        groups=1,
        in_channels=int(m.in_features),
        out_channels=int(m.out_features),
        input_hw=hw,
        executed=call is not None,
        positions=positions,
    )


def _check_patterns(recipe: Recipe, candidates: list[Candidate]) -> None:
    """Every name pattern and class name in the recipe must match some candidate: else a typo."""
    for i, rule in enumerate(recipe.rules):
        for key, values in rule.selector.given().items():
            test = PATTERNS.get(key)
            if test is None:
                continue
            for j, value in enumerate(values):
                if not any(test(value, c) for c in candidates):
                    loc = ("rules", i, rule.action, key, j)
                    raise UserError(_no_match(recipe.where(loc), key, value, candidates))


def _no_match(where: str, key: str, value: str, candidates: list[Candidate]) -> str:
    if key == "module_class":
        pool = sorted({c.module_class for c in candidates})
    else:
        pool = [c.name for c in candidates]
    close = difflib.get_close_matches(value, pool, n=3, cutoff=0.5)
    hint = f"; close: {', '.join(close)}" if close else ""
    return (
        f"{where}: {value!r} matches no conv2d/linear layer of this model "
        f"({len(candidates)} candidates{hint}); fix the pattern, or pick a recipe written for "
        "this model (list them with `quantstudy recipes`)"
    )


def _decide(recipe: Recipe, c: Candidate, winner: int | None) -> LayerDecision:
    if winner is None:
        selected, reason = False, NO_RULE_REASON
    else:
        rule = recipe.rules[winner]
        selected = rule.action == "include"
        reason = rule.why or f"rules[{winner}]: {rule.action} {rule.selector.describe()}"
    return LayerDecision(
        name=c.name,
        op=c.op,
        module_class=c.module_class,
        kernel=c.kernel,
        stride=c.stride,
        groups=c.groups,
        in_channels=c.in_channels,
        out_channels=c.out_channels,
        input_hw=c.input_hw,
        selected=selected,
        rule=winner,
        reason=reason,
    )


def _rule_notes(recipe: Recipe, matched: list[int], decided: list[int]) -> list[str]:
    notes = []
    for i, rule in enumerate(recipe.rules):
        if rule.optional:
            continue
        what = f"rules[{i}] ({rule.action} {rule.selector.describe()})"
        if matched[i] == 0 and rule.action == "include":  # an unused exclude is harmless
            notes.append(f"{what} matched no layer of this model")
        elif matched[i] > 0 and decided[i] == 0:
            notes.append(f"{what} matched {matched[i]} layer(s), all overridden by later rules")
    return notes
