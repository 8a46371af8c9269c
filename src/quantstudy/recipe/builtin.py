"""Where recipes come from: built-in YAML files shipped as package data, or a user's file.

Built-ins live in `recipe/builtin/<name>.yaml`, one recipe per file, the file stem equal to the
recipe name. `FAMILY_RECIPES` maps a model family (`recipe/family.py: family_of`, the one
meaning of the word) to the recipe a study uses when none is given, one line per family. A model
of any other family gets `FALLBACK_RECIPE`, `generic_default`, whose typed rules choose FP8 layers
from what the model holds (dense 1x1 convs, the linears of attention and MLP blocks), and
`default_choice` says which of the two chose it. `FALLBACKS` orders the generic recipes from the
default to the widest, for whoever needs a recipe that selects more (`recipe/choose.py`, the
zoo's answers).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from quantstudy.recipe.family import architecture_of, family_of
from quantstudy.recipe.schema import Recipe, parse_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file, read_bytes

BUILTIN_PREFIX = "builtin:"
# Built-ins renamed, old name -> new: the old name still resolves to the new recipe, with a
# one-line FutureWarning (as timm maps a deprecated model name), so older records and commands
# that name it keep working; a new record names the new one.
RENAMED = {"generic_pointwise_sequential": "generic_pointwise_propagated"}

# family -> its built-in recipe. A family is a whole timm module unless `recipe/family.py: SPLITS`
# names a finer one, so a family recipe covers every variant timm ships of it (ghostnet: v2 and
# v3 too; xception_aligned: 41, 65, 71 and their pre-activation variants, not timm's
# legacy_xception, which is another network in another module; efficientnet: every network of
# timm's efficientnet.py, MobileNetV2, MnasNet, FBNet, MixNet and TinyNet included, whose
# depthwise-separable blocks it selects as it does EfficientNet's).
FAMILY_RECIPES: dict[str, str] = {
    "mobilenetv4": "mobilenetv4_pointwise",
    "ghostnet": "ghostnet_pointwise",
    "xception_aligned": "xception_pointwise",
    "res2net": "res2net_all_after_stem",
    "crossvit": "crossvit_encoder_cross",
    "efficientnet": "generic_pointwise",
}
# The generic recipes, from the default of a model without a family recipe to the widest: the
# dense kxk convs too (which the default keeps in fp16), then every conv and linear layer, stem
# and classifier included, an upper bound on coverage rather than a recipe to ship.
FALLBACKS = ("generic_default", "generic_dense_convs", "generic_all")
FALLBACK_RECIPE = FALLBACKS[0]
UPPER_BOUND = FALLBACKS[-1]


@dataclass(frozen=True)
class DefaultChoice:
    """The built-in recipe a model gets without `--recipe`, its family, and whether the family's
    recipe chose it (False: the family has none, so `FALLBACK_RECIPE` chooses from the layers)."""

    recipe: str
    architecture: str
    family: str
    by_family: bool

    def describe(self) -> str:
        """One line: which rule chose the recipe and why."""
        if self.by_family:
            return (
                f"{self.recipe}, the recipe of the {self.family} family (a recipe written for "
                "the family wins over the generic default)"
            )
        known = ", ".join(FAMILY_RECIPES)
        return (
            f"{self.recipe}: no family recipe for {self.architecture} (family {self.family}); "
            f"family recipes exist for {known}, so the generic default chooses the FP8 layers "
            "from what the model holds"
        )


def _builtin_dir() -> Traversable:
    return resources.files("quantstudy.recipe").joinpath("builtin")


def builtin_names() -> list[str]:
    """Names of the built-in recipes, sorted."""
    files = [p.name for p in _builtin_dir().iterdir()]
    return sorted(f.removesuffix(".yaml") for f in files if f.endswith(".yaml"))


def _load_builtin(name: str) -> Recipe:
    raw = _builtin_dir().joinpath(f"{name}.yaml").read_bytes()
    return parse_recipe(raw, f"{BUILTIN_PREFIX}{name}")


def default_choice(model_name: str) -> DefaultChoice:
    """The built-in recipe for a timm model name (with or without pretrained tag): its family's,
    else the generic default, and which of the two chose it."""
    family = family_of(model_name)
    recipe = FAMILY_RECIPES.get(family)
    arch = architecture_of(model_name)
    return DefaultChoice(recipe or FALLBACK_RECIPE, arch, family, recipe is not None)


def default_recipe_for(model_name: str) -> str:
    """The name of `default_choice`'s recipe."""
    return default_choice(model_name).recipe


def _is_path(source: str) -> bool:
    return "/" in source or "\\" in source or source.endswith((".yaml", ".yml"))


def load_recipe(source: str | Path) -> tuple[Recipe, str]:
    """Load a recipe by built-in name (`name` or `builtin:name`) or file path.

    Returns the recipe and its source label: "builtin:<name>" or the path as given.
    """
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        return _builtin_or_fail(source.removeprefix(BUILTIN_PREFIX))
    if isinstance(source, Path) or _is_path(source):
        return _from_file(Path(source))
    if source in builtin_names() or source in RENAMED:
        return _builtin_or_fail(source)
    if Path(source).is_file():
        return _from_file(Path(source))
    return _builtin_or_fail(source)


def _current(name: str) -> str:
    """A built-in's name now: `name`, or what it was renamed to (`RENAMED`), with a warning."""
    new = RENAMED.get(name)
    if new is None:
        return name
    warnings.warn(f"recipe {name!r} is now named {new!r}; using {new!r}", FutureWarning, 4)
    return new


def _builtin_or_fail(name: str) -> tuple[Recipe, str]:
    name = _current(name)
    names = builtin_names()
    if name not in names:
        raise UserError(
            f"unknown recipe {name!r}: not a built-in and not a file (built-ins: "
            f"{', '.join(names)}); give a built-in name or the path of a recipe .yaml file"
        )
    return _load_builtin(name), f"{BUILTIN_PREFIX}{name}"


def _from_file(path: Path) -> tuple[Recipe, str]:
    if not_a_file(path) == "missing":  # a pipe or a folder: refused by `read_bytes`, unopened
        raise UserError(f"recipe file not found: {path}; check the path")
    return parse_recipe(read_bytes(path, "config", "recipe"), str(path)), str(path)
