"""The sweep file (YAML): which studies to run, validated with errors that name the file line.

A sweep names the axes of its grid (models, recipes, calibrators, seeds, FP8 kernels) and the
settings every study shares (data, calibration, policy, batches, ...)::

    models:                       # timm name and weights; `recipes:` here overrides the sweep's
      - {name: tf_efficientnet_lite0, weights: efficientnet-lite0}
      - {name: ghostnet_100, weights: random, recipes: [ghostnet_pointwise]}
    recipes: [default]            # built-in name or YAML file; `default`: the family's recipe
    calibrators: [max, mse]       # optional; left out: each recipe's own calibrator
    seeds: [0]
    fp8_kernels: [fused]
    data: ../shared/data/imagenet/val-1300      # paths are relative to this file
    calib_data: ../shared/data/imagenet/calib-1000
    calib: 300
    heldout: 1000
    batches: [1, 32, 128]

The grid is the product models x recipes x calibrators x seeds x fp8_kernels; each point is one
`quantstudy run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from quantstudy.recipe.schema import Loc, compose_yaml, key_lines
from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_text
from quantstudy.record.vocab import Calibrator, CompileMode, KernelOption

DEFAULT_RECIPE = "default"  # the model family's built-in recipe (`quantstudy recipes`)
CalibratorName = Calibrator


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _unique(values: list[Any]) -> list[Any]:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"{seen[0]!r} is listed twice; list each value once")
    return values


class ModelSpec(Strict):
    """One model of the grid: a timm name and where its weights come from."""

    name: str = Field(min_length=1)
    weights: str = "cache"  # as `quantstudy run --weights`
    strip_prefix: str | None = None
    recipes: list[str] | None = Field(default=None, min_length=1)  # overrides the sweep's

    @field_validator("recipes")
    @classmethod
    def _unique_recipes(cls, values: list[str] | None) -> list[str] | None:
        return None if values is None else _unique(values)


class SweepSpec(Strict):
    """A validated sweep file; relative paths are already resolved against its folder."""

    models: list[ModelSpec] = Field(min_length=1)
    recipes: list[str] = Field(default=[DEFAULT_RECIPE], min_length=1)
    calibrators: list[CalibratorName] | None = Field(default=None, min_length=1)
    seeds: list[int] = Field(default=[0], min_length=1)
    fp8_kernels: list[KernelOption] = Field(default=[KernelOption.FUSED], min_length=1)
    data: str
    calib_data: str | None = None
    class_list: str | None = None
    calib: PositiveInt = 500
    heldout: PositiveInt = 1500
    batches: list[PositiveInt] = Field(default=[1, 32, 128], min_length=1)
    policy: str | None = None
    device: Literal["cpu", "cuda"] | None = None  # None: cuda when available, else cpu
    compile_mode: CompileMode = CompileMode.DEFAULT
    speed: bool = True
    quality: bool = True  # false: speed-only studies (`quantstudy run --no-quality`)
    test_settings: bool = False

    @field_validator("recipes", "calibrators", "seeds", "fp8_kernels", "batches")
    @classmethod
    def _unique_values(cls, values: list[Any] | None) -> list[Any] | None:
        return None if values is None else _unique(values)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        _unique([(m.name, m.weights) for m in models])
        return models


PATH_KEYS = ("data", "calib_data", "class_list", "policy")


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep file; every mistake is a `UserError` naming the line."""
    origin = str(path)
    if not path.is_file():
        raise UserError(f"sweep file {origin} does not exist; check the path")
    text = read_text(path, "config", "sweep file")
    root, data = compose_yaml(text, origin)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise UserError(f"{origin} line 1: a sweep file is a YAML mapping with keys {_keys()}")
    lines = key_lines(root, ())
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise UserError(_explain(err, lines, origin)) from None
    spec = _resolve_paths(spec, path.parent)
    _check_paths(spec, lines, origin)
    from quantstudy.model.loading import check_listed_models  # imports torch: once it is valid

    names = [m.name for m in spec.models]
    check_listed_models(names, lambda i: f"{origin} line {lines[('models', i)]}: models.{i}.name")
    return spec


def _check_paths(spec: SweepSpec, lines: dict[Loc, int], origin: str) -> None:
    """A folder or file the sweep names must exist, or every point would fail alike, later."""
    for key, folder in (("data", True), ("calib_data", True), ("class_list", False)):
        value = getattr(spec, key)
        if value is None or (Path(value).is_dir() if folder else Path(value).is_file()):
            continue
        what = "folder" if folder else "file"
        raise UserError(
            f"{origin} line {lines.get((key,), 1)}: {key}: {value} is not an existing {what} "
            "(paths are relative to the sweep file); fix the path"
        )


def _resolve_paths(spec: SweepSpec, base: Path) -> SweepSpec:
    """Paths relative to the sweep file's folder, made absolute: a worker runs elsewhere."""
    changes: dict[str, Any] = {
        key: str((base / value).resolve())
        for key in PATH_KEYS
        if (value := getattr(spec, key)) is not None
    }
    changes["recipes"] = [_recipe_path(r, base) for r in spec.recipes]
    changes["models"] = [
        m.model_copy(
            update={
                "recipes": None
                if m.recipes is None
                else [_recipe_path(r, base) for r in m.recipes],
                "weights": _weights_path(m.weights, base),
            }
        )
        for m in spec.models
    ]
    return spec.model_copy(update=changes)


def _recipe_path(recipe: str, base: Path) -> str:
    """A recipe file (as `recipe/builtin.py` tells one from a name) made absolute."""
    if "/" in recipe or "\\" in recipe or recipe.endswith((".yaml", ".yml")):
        return str((base / recipe).resolve())
    return recipe


def _weights_path(weights: str, base: Path) -> str:
    """A checkpoint file given relative to the sweep file, made absolute; names pass through."""
    candidate = base / weights
    return str(candidate.resolve()) if ("/" in weights or candidate.is_file()) else weights


def _keys(model: type[BaseModel] = SweepSpec) -> str:
    return ", ".join(model.model_fields)


def _explain(err: ValidationError, lines: dict[Loc, int], origin: str) -> str:
    """The first problem as `<file> line N: <key path>: <what is wrong>`."""
    first = err.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    line = next((lines[loc[:end]] for end in range(len(loc), -1, -1) if loc[:end] in lines), None)
    at = f"{origin} line {line}" if line is not None else origin
    where = ".".join(str(p) for p in loc) or "top level"
    kind = first["type"]
    if kind == "extra_forbidden":
        model = ModelSpec if "models" in loc[:-1] else SweepSpec
        message = f"unknown key {loc[-1]!r} (known: {_keys(model)})"
    elif kind == "missing":
        message = f"required key {loc[-1]!r} is missing"
    elif kind in ("literal_error", "enum"):
        expected = first.get("ctx", {}).get("expected", "")
        message = f"{first['input']!r} is not allowed (known: {expected})"
    else:
        message = str(first["msg"]).removeprefix("Value error, ")
        if kind != "value_error":
            message += f" (got {first['input']!r})"
    return f"{at}: {where}: {message}"
