"""The sweep file (YAML): which studies to run, validated with errors that name the file line.

A sweep names its models (a model list, `study/model_list.py`), the axes of its grid and the
study options every study shares; every option a study has (`record/inputs.py: StudyConfig`, as
`quantstudy run` takes it) can be shared or swept, without this file naming it::

    models:                       # a model list's entries; an entry's `recipe` overrides the axis
      - {name: tf_efficientnet_lite0, weights: efficientnet-lite0}
      - {name: ghostnet_100, weights: random, recipe: ghostnet_pointwise}
    recipes: [default]            # built-in name or YAML file; `default`: the family's recipe
    calibrators: [max, mse]       # optional; left out: each recipe's own calibrator
    seeds: [0]
    fp8_kernels: [fused]
    grid:                         # any other study option, swept: option -> its values
      fp8_accumulate: [fast, promote128]
    data: ../shared/data/imagenet/val-1300      # a study option shared by every study;
    calib_data: ../shared/data/imagenet/calib-1000   # paths are relative to this file
    calib: 300
    heldout: 1000
    batches: [1, 32, 128]

`recipes`, `seeds` and `fp8_kernels` are the axes `recipe`, `seed` and `fp8_kernel` (a `grid:`
entry of those names is the same axis). The grid is the product models x recipes x calibrators
x seeds x fp8_kernels x the `grid:` axes in file order; each point is one `quantstudy run`. A
value is checked as the study would check it, against its own line (a boolean is never read as a
number, nor a number as a boolean); the file's recipes, checkpoints and policy are read as the
file is, so `--dry-run` refuses what its studies would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, cast, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.yaml_lines import Loc, compose_yaml, key_lines
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import BOUND_REASONS, DEFAULT_FP8_KERNEL, PathText
from quantstudy.record.readers import read_text
from quantstudy.record.vocab import Calibrator, Device
from quantstudy.study.model_list import ModelEntry, check_weights, is_path, parse_models, problem

DEFAULT_RECIPE = "default"  # the model family's built-in recipe (`quantstudy recipes`)
CalibratorName = Calibrator
# The older axis keys: each is the axis of one study option.
AXIS_KEYS = {"recipes": "recipe", "seeds": "seed", "fp8_kernels": "fp8_kernel"}
AXIS_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "recipe": (DEFAULT_RECIPE,),
    "seed": (0,),
    "fp8_kernel": (DEFAULT_FP8_KERNEL,),
}
# Study options a sweep does not take: the model is the list's, each study's folder the sweep's.
NOT_OPTIONS = ("model", "out")
OPTIONS = tuple(f for f in StudyConfig.model_fields if f not in NOT_OPTIONS)
REQUIRED = tuple(f for f in OPTIONS if StudyConfig.model_fields[f].is_required())


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file; relative paths are already resolved against its folder.

    `settings`: the study options every study shares, as given; `axes`: each swept option and
    its values, `recipe`, `seed` and `fp8_kernel` first (a recipe may be `DEFAULT_RECIPE`)."""

    models: tuple[ModelEntry, ...]
    settings: dict[str, Any]
    axes: dict[str, tuple[Any, ...]]
    calibrators: tuple[Calibrator, ...] | None = None
    source: str = "sweep file"  # the file, for messages

    @property
    def device(self) -> Device | None:
        """The device every study runs on (None: cuda when available, else cpu)."""
        device = self.settings.get("device")
        return None if device is None else Device(device)


class _File(BaseModel):
    """The keys of a sweep file that are not study options."""

    model_config = ConfigDict(frozen=True, extra="allow")

    models: list[Any]
    calibrators: list[Calibrator] | None = Field(None, min_length=1)
    grid: dict[str, list[Any]] = Field(default_factory=dict)


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep file; every mistake is a `UserError` naming the line."""
    origin = str(path)
    text = read_text(path, "config", "sweep file")
    root, data = compose_yaml(text, origin)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise UserError(f"{origin} line 1: a sweep file is a YAML mapping with keys {_keys()}")
    lines = key_lines(root, ())
    try:
        head = _File.model_validate(data)
    except ValidationError as err:
        raise UserError(problem(err, lines, origin)) from None
    _unique(head.calibrators or [], ("calibrators",), lines, origin)
    axes = _axes(data, head.grid, lines, origin)
    settings = _settings(data, axes, lines, origin)
    base = path.parent
    settings = {k: _path_value(k, v, base) for k, v in settings.items()}
    axes = {k: tuple(_path_value(k, v, base) for v in values) for k, values in axes.items()}
    _check_files(settings, axes, lines, origin)
    models = parse_models(head.models, lines, origin, base)
    calibrators = tuple(head.calibrators) if head.calibrators else None
    return SweepSpec(models, settings, axes, calibrators, origin)


def _keys() -> str:
    return ", ".join(["models", *AXIS_KEYS, "calibrators", "grid", *OPTIONS])


def _axes(
    data: dict[str, Any], grid: dict[str, list[Any]], lines: dict[Loc, int], origin: str
) -> dict[str, tuple[Any, ...]]:
    """Each swept option and its values, validated: the older axis keys, then `grid:`."""
    given: dict[str, tuple[Loc, list[Any]]] = {}
    for key, option in AXIS_KEYS.items():
        if key in data:
            given[option] = ((key,), data[key])
    for option, values in grid.items():
        loc: Loc = ("grid", option)
        if option not in OPTIONS:
            raise UserError(f"{_at(loc, lines, origin)}: unknown study option {option!r} "
                            f"(known: {', '.join(OPTIONS)})")  # fmt: skip
        if option == "device":
            raise UserError(f"{_at(loc, lines, origin)}: a sweep's studies run on one device "
                            "(its executor's); give device as a shared option")  # fmt: skip
        if option in given:
            old = ".".join(map(str, given[option][0]))
            raise UserError(f"{_at(loc, lines, origin)}: {old} sweeps {option} already; give one")
        if option in data:
            raise UserError(f"{_at(loc, lines, origin)}: {option} is also shared; give one")
        given[option] = (loc, values)
    axes = dict(AXIS_DEFAULTS)
    for option, (loc, values) in given.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{_at(loc, lines, origin)}: give a list of at least one value")
        _unique(values, loc, lines, origin)
        axes[option] = tuple(
            _value(option, v, (*loc, i), lines, origin) for i, v in enumerate(values)
        )
    return axes


def _settings(
    data: dict[str, Any], axes: dict[str, tuple[Any, ...]], lines: dict[Loc, int], origin: str
) -> dict[str, Any]:
    """The shared study options, each validated as the study would (`_value`)."""
    known = {"models", "calibrators", "grid", *AXIS_KEYS}
    settings = {}
    for key, value in data.items():
        if key in known:
            continue
        if key not in OPTIONS:
            raise UserError(f"{_at((key,), lines, origin)}: unknown key {key!r} (known: {_keys()})")
        if key in axes and key in AXIS_DEFAULTS and _axis_given(key, data):
            raise UserError(f"{_at((key,), lines, origin)}: {key} is also swept; give one")
        settings[key] = _value(key, value, (key,), lines, origin)
    for key in REQUIRED:
        if key not in settings and key not in axes:
            raise UserError(f"{origin} line 1: {key}: required key {key!r} is missing")
    for key in AXIS_DEFAULTS:
        if key in settings:  # one shared value: the axis of one
            axes[key] = (settings.pop(key),)
    return settings


def _axis_given(option: str, data: dict[str, Any]) -> bool:
    old = next(k for k, o in AXIS_KEYS.items() if o == option)
    return old in data or option in data.get("grid", {})


def _value(option: str, value: Any, loc: Loc, lines: dict[Loc, int], origin: str) -> Any:
    """`value` of the study option `option` as `StudyConfig` validates it (its type, bounds and
    parsing), refused at its line; a boolean for a number or a number for a boolean is refused,
    not converted (YAML `true` is not 1)."""
    field = StudyConfig.model_fields[option]
    wrong = _crossed_type(field.annotation, value)
    if wrong:
        raise UserError(f"{_at(loc, lines, origin)}: {value!r} is {wrong}")
    try:
        return _adapter(option).validate_python(value)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = _at((*loc, *first["loc"]), lines, origin)
        msg = str(first["msg"]).removeprefix("Value error, ")
        why = BOUND_REASONS.get(option, "") if "than or equal" in msg else ""
        raise UserError(f"{where}: {msg} (got {first['input']!r}){why}") from None


@functools.cache
def _adapter(option: str) -> TypeAdapter[Any]:
    """The validator of one `StudyConfig` field alone: its type, bounds and parsing."""
    field = StudyConfig.model_fields[option]
    return TypeAdapter(cast(Any, Annotated[field.annotation, field]))


def _flat(annotation: Any) -> set[Any]:
    """The types an annotation admits, through Optional, unions, Annotated and tuples."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _flat(get_args(annotation)[0])
    if origin in (Union, type(int | None)) or origin is tuple:
        return {t for arg in get_args(annotation) if arg is not Ellipsis for t in _flat(arg)}
    return {annotation}


def _crossed_type(annotation: Any, value: Any) -> str | None:
    """What is wrong with `value` for a field of `annotation`, where pydantic would convert a
    boolean to a number or a number or word to a boolean; None: the type is the field's."""
    kinds = _flat(annotation)
    values = value if isinstance(value, list) else [value]
    if bool in kinds and any(not isinstance(v, bool) for v in values):
        return "not a boolean: give true or false"
    if bool not in kinds and any(isinstance(v, bool) for v in values):
        return "a boolean, not a value of this option"
    return None


def _unique(values: list[Any], loc: Loc, lines: dict[Loc, int], origin: str) -> None:
    seen = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if seen is not None:
        raise UserError(f"{_at(loc, lines, origin)}: {seen!r} is listed twice; list each once")


def _at(loc: Loc, lines: dict[Loc, int], origin: str) -> str:
    """`<origin> line N: <key path>` (the line of the longest part of `loc` the file has)."""
    line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), 1)
    return f"{origin} line {line}: {'.'.join(map(str, loc))}"


def _path_value(option: str, value: Any, base: Path) -> Any:
    """A path option given relative to the sweep file, made absolute: a worker runs elsewhere
    (a policy preset's name and the weights' words and named sources stay names)."""
    if value is None:
        return value
    if option == "recipe":
        return _recipe_path(value, base)
    if option == "weights":
        return str((base / value).resolve()) if is_path(value, base) else value
    if not _is_path_option(option) or (option == "policy" and value in _presets()):
        return value
    return str((base / value).resolve())


def _presets() -> tuple[str, ...]:
    from quantstudy.decision.policy import PRESETS  # imports scipy: not for the parser

    return tuple(PRESETS)


def _is_path_option(option: str) -> bool:
    """A study option whose value is a path (`record/inputs.py: PathText`)."""
    field = StudyConfig.model_fields[option]  # a required field's Annotated is in its metadata
    return PathText in get_args(field.annotation) or tuple(field.metadata) == get_args(PathText)[1:]


def _recipe_path(recipe: str, base: Path) -> str:
    """A recipe file (as `recipe/builtin.py` tells one from a name) made absolute."""
    if "/" in recipe or "\\" in recipe or recipe.endswith((".yaml", ".yml")):
        return str((base / recipe).resolve())
    return recipe


def _check_files(
    settings: dict[str, Any], axes: dict[str, tuple[Any, ...]], lines: dict[Loc, int], origin: str
) -> None:
    """Folders, files, recipes and the policy the sweep names must be there and readable, or
    every point would fail alike, later (and `--dry-run` would pass)."""
    for key, folder in (("data", True), ("calib_data", True), ("class_list", False)):
        value = settings.get(key)
        if value is None or (Path(value).is_dir() if folder else Path(value).is_file()):
            continue
        what = "folder" if folder else "file"
        raise UserError(
            f"{_at((key,), lines, origin)}: {value} is not an existing {what} (paths are "
            "relative to the sweep file); fix the path"
        )
    for i, recipe in enumerate(axes["recipe"]):
        if recipe != DEFAULT_RECIPE:
            _said(load_recipe, recipe, _recipe_loc(i, lines), lines, origin)
    if settings.get("policy") is not None:
        from quantstudy.decision.policy import load_policy  # imports scipy: not for the parser

        _said(load_policy, settings["policy"], ("policy",), lines, origin)
    if settings.get("weights") is not None:
        check_weights(settings["weights"], _at(("weights",), lines, origin))


def _recipe_loc(i: int, lines: dict[Loc, int]) -> Loc:
    for loc in (("recipes", i), ("grid", "recipe", i), ("recipe",)):
        if loc in lines:
            return loc
    return ("recipes", i)


def _said(
    check: Callable[[str], object], value: str, loc: Loc, lines: dict[Loc, int], origin: str
) -> None:
    """`check(value)`, its `UserError` said at the line of `loc`."""
    try:
        check(value)
    except UserError as err:
        raise UserError(f"{_at(loc, lines, origin)}: {err}") from None
