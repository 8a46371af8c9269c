"""Which built-in recipes select something on a model: what a recipe that selects nothing names.

A study refuses a recipe that selects no layer (there would be no FP8 engine to study); the
refusal is useful only if it says what would work, so every built-in recipe is resolved against
the candidates the failed resolution already collected (no second forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantstudy.recipe.builtin import UPPER_BOUND, builtin_names, load_recipe
from quantstudy.recipe.resolve import Resolution, apply_rules
from quantstudy.recipe.selectors import Candidate
from quantstudy.record.errors import UserError


@dataclass(frozen=True)
class Alternative:
    """A built-in recipe and how many layers of the model it selects."""

    name: str
    selected: int

    def __str__(self) -> str:
        return f"{self.name} ({self.selected} layer{'s' if self.selected != 1 else ''})"


def alternatives(candidates: list[Candidate], without: str | None = None) -> list[Alternative]:
    """Built-in recipes (variants left out: they select what their base selects) that select
    at least one of `candidates`, by name, `UPPER_BOUND` (`recipe/builtin.py`) last: it selects
    every layer, an upper bound rather than a recipe to ship; `without` is left out too."""
    found = []
    for name in builtin_names():
        recipe, _ = load_recipe(f"builtin:{name}")
        if recipe.variant_of is not None or name == without:
            continue
        try:
            n = len(apply_rules(recipe, candidates).selected)
        except UserError:  # a family recipe naming layers this model does not have
            continue
        if n:
            found.append(Alternative(name, n))
    return sorted(found, key=lambda a: (a.name == UPPER_BOUND, a.name))


def nothing_selected(resolution: Resolution, recipe_name: str) -> str:
    """What to say when `resolution` selects no layer: the built-in recipes that would."""
    others = alternatives(resolution.candidates, without=recipe_name)
    if not others:
        return (
            "no built-in recipe selects a layer of it either: write a recipe file that does "
            "(the built-ins in quantstudy/recipe/builtin/ show the format)"
        )
    return (
        f"built-in recipes that select layers of it: {', '.join(map(str, others))}; "
        "give one with --recipe NAME"
    )
