"""Where recipes come from: built-in YAML files shipped as package data, or a user's file.

Built-ins live in `recipe/builtin/<name>.yaml`, one recipe per file, the file stem equal to the
recipe name. `FAMILY_DEFAULTS` maps a timm architecture to the recipe a study uses when none is
given: an explicit table, one line per family, first match wins.
"""

from __future__ import annotations

import fnmatch
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from quantstudy.recipe.schema import Recipe, parse_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_bytes

BUILTIN_PREFIX = "builtin:"

# (architecture glob, built-in recipe). The architecture is the timm name without its
# pretrained tag, e.g. "mobilenetv4_conv_large" for "mobilenetv4_conv_large.e500_r256_in1k".
FAMILY_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("mobilenetv4_*", "mobilenetv4_pointwise"),
    ("ghostnet_*", "ghostnet_pointwise"),
    ("xception41*", "xception_pointwise"),
    ("res2net*", "res2net_all_after_stem"),
    ("crossvit_*", "crossvit_encoder_cross"),
    ("tf_efficientnet_lite*", "generic_pointwise"),
    ("efficientnet*", "generic_pointwise"),
)
FALLBACK_RECIPE = "generic_pointwise"


def _builtin_dir() -> Traversable:
    return resources.files("quantstudy.recipe").joinpath("builtin")


def builtin_names() -> list[str]:
    """Names of the built-in recipes, sorted."""
    files = [p.name for p in _builtin_dir().iterdir()]
    return sorted(f.removesuffix(".yaml") for f in files if f.endswith(".yaml"))


def _load_builtin(name: str) -> Recipe:
    raw = _builtin_dir().joinpath(f"{name}.yaml").read_bytes()
    return parse_recipe(raw, f"{BUILTIN_PREFIX}{name}")


def list_builtin() -> list[tuple[str, str]]:
    """(name, description) of every built-in recipe, sorted by name."""
    return [(name, _load_builtin(name).description) for name in builtin_names()]


def variants_of(name: str) -> list[str]:
    """Built-in recipes that declare `variant_of: <name>`, sorted."""
    return [n for n in builtin_names() if _load_builtin(n).variant_of == name]


def architecture_of(model_name: str) -> str:
    """`timm/mobilenetv4_conv_large.e500_r256_in1k` -> `mobilenetv4_conv_large`."""
    return model_name.rsplit("/", 1)[-1].split(".", 1)[0]


def default_recipe_for(model_name: str) -> str:
    """The family's built-in recipe for a timm model name (with or without pretrained tag)."""
    arch = architecture_of(model_name)
    for pattern, recipe in FAMILY_DEFAULTS:
        if fnmatch.fnmatchcase(arch, pattern):
            return recipe
    return FALLBACK_RECIPE


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
    if source in builtin_names():
        return _builtin_or_fail(source)
    if Path(source).is_file():
        return _from_file(Path(source))
    return _builtin_or_fail(source)


def _builtin_or_fail(name: str) -> tuple[Recipe, str]:
    names = builtin_names()
    if name not in names:
        raise UserError(
            f"unknown recipe {name!r}: not a built-in and not a file (built-ins: "
            f"{', '.join(names)}); give a built-in name or the path of a recipe .yaml file"
        )
    return _load_builtin(name), f"{BUILTIN_PREFIX}{name}"


def _from_file(path: Path) -> tuple[Recipe, str]:
    if not path.is_file():
        raise UserError(f"recipe file not found: {path}; check the path")
    return parse_recipe(read_bytes(path, "config", "recipe"), str(path)), str(path)
