"""Text and JSON views of recipes for `quantstudy recipes` and `quantstudy recipes show`.

Plain text, no terminal styling, so the output can be pasted into a review or diffed.
"""

from __future__ import annotations

import json

from quantstudy.recipe.builtin import FALLBACK_RECIPE, FAMILY_RECIPES, builtin_names, load_recipe
from quantstudy.recipe.choose import nothing_selected
from quantstudy.recipe.family import SPLITS
from quantstudy.recipe.resolve import Resolution
from quantstudy.recipe.selectors import layer_kind
from quantstudy.recipe.tensorrt import prescreen, prescreen_lines
from quantstudy.record import LayerDecision

COLUMNS = ("#", "layer", "kind", "shape", "input", "rule", "why")


def format_resolution(
    res: Resolution, recipe_name: str, model_name: str, as_json: bool, chosen: str | None = None
) -> str:
    """The layer table of a resolved recipe: selected, then excluded with the rule, then counts.
    `chosen`: why the model got this recipe, when none was named (`DefaultChoice.describe`)."""
    notes = list(res.notes)
    if not res.selected:
        notes.append(f"it selects no layer: {nothing_selected(res, recipe_name)}")
    if as_json:
        doc = {
            "recipe": recipe_name,
            "model": model_name,
            "chosen": chosen,
            "counts": res.counts,
            "selected": [d.model_dump(mode="json") for d in res.selected],
            "excluded": [d.model_dump(mode="json") for d in res.excluded],
            "notes": notes,
            "tensorrt_prescreen": [vars(f) for f in prescreen(res.selected)],
        }
        return json.dumps(doc, indent=2)
    total = res.counts["candidates.total"]
    lines = [
        f"recipe {recipe_name} on {model_name}: {len(res.selected)} of {total} conv2d/linear "
        "layers selected for FP8",
        *([f"chosen: {chosen}"] if chosen else []),
        "",
        f"Selected ({len(res.selected)}):",
        *_table(res.selected),
        "",
        f"Excluded, left in the engine's compute dtype ({len(res.excluded)}):",
        *_table(res.excluded),
        "",
        "Counts:",
        *(f"  {key:<26} {value}" for key, value in res.counts.items()),
    ]
    if notes:
        lines += ["", "Notes:", *(f"  - {note}" for note in notes)]
    lines += ["", *prescreen_lines(res.selected)]
    return "\n".join(lines)


def format_recipe_list() -> str:
    """Built-in recipes with their descriptions, and the family default table."""
    rows = []
    for name in builtin_names():
        recipe, _ = load_recipe(f"builtin:{name}")
        variant = f"[variant of {recipe.variant_of}] " if recipe.variant_of else ""
        rows.append((name, variant + recipe.description))
    width = max(len(name) for name, _ in rows)
    lines = ["Built-in recipes (give a name, or the path of your own recipe .yaml):"]
    lines += [f"  {name:<{width}}  {text}" for name, text in rows]
    splits = "; ".join(f"{s.family}: {', '.join(s.globs)}" for s in SPLITS)
    lines += ["", f"Default recipe by model family (the timm module of the model, or {splits}):"]
    fam_width = max(len(f) for f in FAMILY_RECIPES)
    lines += [f"  {family:<{fam_width}}  {recipe}" for family, recipe in FAMILY_RECIPES.items()]
    lines.append(f"  {'(other)':<{fam_width}}  {FALLBACK_RECIPE} (FP8 layers chosen by its rules)")
    return "\n".join(lines)


def _table(decisions: list[LayerDecision]) -> list[str]:
    if not decisions:
        return ["  (none)"]
    rows = [COLUMNS] + [_row(i, d) for i, d in enumerate(decisions)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(COLUMNS) - 1)]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        out.append("  " + "  ".join([*cells, row[-1]]))
    return out


def _row(i: int, d: LayerDecision) -> tuple[str, ...]:
    return (
        str(i),
        d.name,
        layer_kind(d.op, d.kernel, d.groups, d.in_channels),
        _shape(d),
        "x".join(map(str, d.input_hw)) if d.input_hw else "not run",
        f"rules[{d.rule}]" if d.rule is not None else "-",
        d.reason,
    )


def _shape(d: LayerDecision) -> str:
    channels = f"{d.in_channels}->{d.out_channels}"
    if d.op == "linear" or d.kernel is None or d.stride is None:
        return channels
    groups = f" g{d.groups}" if d.groups > 1 else ""
    return f"{d.kernel[0]}x{d.kernel[1]} s{d.stride[0]}{groups} {channels}"
