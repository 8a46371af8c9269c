"""Where recipes come from: built-in YAML files shipped as package data, or a user's file.

Built-ins live in `recipe/builtin/<name>.yaml`, one recipe per file, the file stem equal to the
recipe name. `FAMILY_DEFAULTS` maps a timm architecture to the recipe a study uses when none is
given: an explicit table, one line per family, first match wins; each pattern covers every
variant timm ships of that family (a unit test holds it to `timm.list_models`). A model of any
other family gets `FALLBACK_RECIPE`, `generic_default`, whose typed rules choose FP8 layers from
what the model holds (dense 1x1 convs, the linears of attention and MLP blocks), and
`default_choice` says which of the two chose it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from quantstudy.recipe.schema import Recipe, parse_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_bytes

BUILTIN_PREFIX = "builtin:"

# (architecture glob, built-in recipe). The architecture is the timm name without its
# pretrained tag, e.g. "mobilenetv4_conv_large" for "mobilenetv4_conv_large.e500_r256_in1k".
# ghostnet* covers ghostnetv2 and ghostnetv3 (the same Ghost blocks, one timm module), xception*
# the aligned xceptions 41, 65 and 71 with their pre-activation variants (timm's legacy_xception
# starts otherwise and is another network), res2ne* both res2net and res2next.
FAMILY_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("mobilenetv4_*", "mobilenetv4_pointwise"),
    ("ghostnet*", "ghostnet_pointwise"),
    ("xception*", "xception_pointwise"),
    ("res2ne*", "res2net_all_after_stem"),
    ("crossvit_*", "crossvit_encoder_cross"),
    ("efficientnet*", "generic_pointwise"),
    ("tf_efficientnet*", "generic_pointwise"),
    ("test_efficientnet*", "generic_pointwise"),  # timm's tiny EfficientNets for tests
)
FALLBACK_RECIPE = "generic_default"


@dataclass(frozen=True)
class DefaultChoice:
    """The built-in recipe a model gets without `--recipe`, and which row of `FAMILY_DEFAULTS`
    chose it (None: no family matched, so `FALLBACK_RECIPE` chooses from the layers)."""

    recipe: str
    architecture: str
    pattern: str | None

    def describe(self, family: str | None = None) -> str:
        """One line: which rule chose the recipe and why. `family`: the model's timm family
        (its module, `timm_family`), named when no family recipe recognised it."""
        if self.pattern is not None:
            return (
                f"{self.recipe}, the family recipe of {self.pattern} (a recipe written for "
                "the family wins over the generic default)"
            )
        of = f" (timm family {family})" if family else ""
        known = ", ".join(pattern for pattern, _ in FAMILY_DEFAULTS)
        return (
            f"{self.recipe}: no family recipe recognises {self.architecture}{of}; family recipes "
            f"exist for {known}, so the generic default chooses the FP8 layers from what the "
            "model holds"
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


def architecture_of(model_name: str) -> str:
    """`timm/mobilenetv4_conv_large.e500_r256_in1k` -> `mobilenetv4_conv_large`."""
    return model_name.rsplit("/", 1)[-1].split(".", 1)[0]


def default_choice(model_name: str) -> DefaultChoice:
    """The built-in recipe for a timm model name (with or without pretrained tag): its family's,
    else the generic default, and which of the two chose it."""
    arch = architecture_of(model_name)
    for pattern, recipe in FAMILY_DEFAULTS:
        if fnmatch.fnmatchcase(arch, pattern):
            return DefaultChoice(recipe, arch, pattern)
    return DefaultChoice(FALLBACK_RECIPE, arch, None)


def default_recipe_for(model_name: str) -> str:
    """The name of `default_choice`'s recipe."""
    return default_choice(model_name).recipe


def timm_family(model_name: str) -> str | None:
    """The timm module that defines the architecture (`vision_transformer` for
    `vit_tiny_patch16_224`): timm keeps one family per module. None for a name timm does not
    register. Imports timm (and torch) on the first call."""
    import timm.models

    arch = architecture_of(model_name)
    if not timm.models.is_model(arch):
        return None
    return str(timm.models.model_entrypoint(arch).__module__).rsplit(".", 1)[-1]


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
