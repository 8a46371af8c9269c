"""Write the searched recipe: a YAML file that resolves to exactly the chosen layers.

The file keeps the candidate recipe's weight and activation settings and has one include rule
per chosen layer, `name_regex: ^<escaped name>$`, with the search's reason for that layer as the
rule's `why` (so the study's layer table says why each layer is FP8). Everything else stays
excluded by default. Before the file is written it is parsed and resolved against the model;
a resolution that differs from the chosen set is a bug and raises.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import yaml
from torch import nn

from quantstudy.recipe.resolve import resolve
from quantstudy.recipe.schema import Recipe, parse_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_text_atomic


def exact_pattern(layer: str) -> str:
    """A regex that matches `layer` and nothing else (re.fullmatch; anchored for the reader)."""
    return f"^{re.escape(layer)}$"


def recipe_text(
    base: Recipe,
    chosen: list[str],
    *,
    name: str,
    description: str,
    reasons: dict[str, str] | None = None,
    header: list[str] | None = None,
) -> str:
    """The YAML text of a recipe selecting exactly `chosen`, settings copied from `base`."""
    if not chosen:
        raise UserError(
            "no layer pays under the quality budget, so there is no recipe to write; loosen the "
            "policy's quality budget or --margin, or keep the model in fp16"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"chosen layers repeat: {chosen}")
    reasons = reasons or {}
    data = {
        "name": name,
        "description": description,
        "variant_of": base.name,
        "format": base.format,
        "weights": base.weights.model_dump(mode="json"),
        "activations": base.activations.model_dump(mode="json"),
        "rules": [
            {
                "include": {"name_regex": [exact_pattern(layer)]},
                "why": reasons.get(layer) or "chosen by quantstudy search",
            }
            for layer in chosen
        ],
    }
    lines = [f"# {line}".rstrip() for line in (header or [])]
    body = yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=False)
    return "\n".join([*lines, body]) if lines else body


def write_recipe(
    path: Path,
    base: Recipe,
    chosen: list[str],
    model: nn.Module,
    example: torch.Tensor,
    *,
    name: str,
    description: str,
    reasons: dict[str, str] | None = None,
    header: list[str] | None = None,
) -> Recipe:
    """Write the recipe for `chosen` to `path` after checking that it resolves to exactly them."""
    text = recipe_text(
        base, chosen, name=name, description=description, reasons=reasons, header=header
    )
    recipe = parse_recipe(text.encode("utf-8"), str(path))
    got = resolve(recipe, model, example).selected_names
    if sorted(got) != sorted(chosen):
        extra, missing = sorted(set(got) - set(chosen)), sorted(set(chosen) - set(got))
        raise RuntimeError(
            f"the emitted recipe resolves to {len(got)} layers, not the {len(chosen)} chosen: "
            f"extra {extra[:5]}, missing {missing[:5]}"
        )
    write_text_atomic(Path(path), text)
    return recipe
