"""Every list of models quantstudy studies, in one schema read by one reader: the zoo's
(`zoo/models.yaml`), a sweep file's `models:`, a peers rows file and the `model[:recipe]`
arguments of `bench products`.

A list file is a YAML mapping with the one key `models`, a list of entries::

    models:
      - {name: resnet50, recipe: generic_dense_convs, weights: random}
      - {name: tf_efficientnet_lite0, weights: efficientnet-lite0}
      - {name: ghostnet_100}              # the command's weights, the family's recipe

An entry names a timm model (`name`, with or without pretrained tag) and, optionally, the study
options that are its own, each as `quantstudy run` takes it: `weights` (`random`, `cache`, a
named source or a checkpoint file), `recipe` (a built-in name or a recipe file) and
`strip_prefix`; one left out takes the command's option. A file named in an entry is relative to
the list's folder. An entry does not say its family: that is the model's (`recipe/family.py`).
The list is checked whole as it is read, `--dry-run` too: every model known to timm, every
recipe loadable, every checkpoint file present, no model listed twice alike, and at least one.

Older spellings still read: a peers rows file's `rows:` and `model:`, a zoo list's `family:`
(left out: the family is the model's), and a sweep's `recipes: [a, b]` on one model, read as one
entry per recipe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.family import family_of
from quantstudy.recipe.yaml_lines import Loc, compose_yaml, key_lines
from quantstudy.record.base import Section
from quantstudy.record.errors import UserError
from quantstudy.record.readers import decode_utf8, not_a_file, read_bytes

LIST_KEY = "models"
OLD_LIST_KEY = "rows"  # a peers rows file's
WEIGHT_WORDS = ("random", "cache")  # `--weights` values that name no file


class ModelEntry(Section):
    """One model of a list and the study options that are its own (None: the command's)."""

    name: str = Field(min_length=1)  # timm name, optionally with pretrained tag
    weights: str | None = Field(None, min_length=1)
    recipe: str | None = Field(None, min_length=1)
    strip_prefix: str | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        """A peers row's `model:` is the name; a zoo list's `family:` is the model's own."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "family"}
        if "model" in data and "name" not in data:
            data["name"] = data.pop("model")
        return data

    @property
    def family(self) -> str:
        """The model's family (`recipe/family.py: family_of`)."""
        return family_of(self.name)

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """What makes two entries the same study: model, weights and recipe."""
        return self.name, self.weights, self.recipe

    def __str__(self) -> str:
        """`model[:recipe]`, as `bench products` takes and records a row."""
        return self.name if self.recipe is None else f"{self.name}:{self.recipe}"


class _Entry(ModelEntry):
    """An entry as a file may write it: with a sweep's older `recipes:` list."""

    recipes: list[str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_spelling(self) -> _Entry:
        if self.recipes is not None and self.recipe is not None:
            raise ValueError("give recipe or recipes, not both")
        return self

    def entries(self) -> list[ModelEntry]:
        fields = self.model_dump(exclude={"recipes"})
        if self.recipes is None:
            return [ModelEntry(**fields)]
        return [ModelEntry(**fields | {"recipe": r}) for r in dict.fromkeys(self.recipes)]


class _Listed(Section):
    models: list[_Entry] = Field(min_length=1)


@dataclass(frozen=True)
class ModelList:
    """A read list: its entries (files named in them made absolute), where it came from, and the
    SHA-256 of its bytes."""

    entries: tuple[ModelEntry, ...]
    source: str
    sha256: str


def read_model_list(path: Path, what: str = "model list") -> ModelList:
    """The list file at `path` (module docstring); a mistake is a `UserError` naming its line."""
    origin = str(path)
    data_bytes = read_bytes(path, "config", what)
    root, data = compose_yaml(decode_utf8(data_bytes, f"{what} {origin}"), origin)
    keys = set(data) if isinstance(data, dict) else set()
    key = OLD_LIST_KEY if keys == {OLD_LIST_KEY} else LIST_KEY
    if not isinstance(root, yaml.MappingNode) or keys not in ({LIST_KEY}, {OLD_LIST_KEY}):
        found = f" (found: {', '.join(map(str, sorted(keys)))})" if keys else ""
        raise UserError(
            f"{origin} line 1: a {what} is a mapping with the one key {LIST_KEY}, a list of "
            f"models{found}; docs/zoo.md shows one"
        )
    assert isinstance(data, dict)  # the check above
    lines = key_lines(root, ())
    entries = parse_models(data[key], lines, origin, path.parent, key)
    return ModelList(entries, origin, hashlib.sha256(data_bytes).hexdigest())


# Short names that committed records and device jobs go by instead of the timm name (the package
# bench's records, docs/package.md; the jobs of tools/device/jobs/records.yaml)
RECORD_NAMES = {"tf_efficientnet_lite0": "lite0"}


def record_name(name: str) -> str:
    """The name a model's records go by: its short name where it has one, else `name` (a short
    name given reads as itself)."""
    return RECORD_NAMES.get(name, name)


def by_record_name(path: Path, what: str = "model list") -> dict[str, ModelEntry]:
    """The models of the list at `path` by the name their records go by (`record_name`)."""
    return {record_name(e.name): e for e in read_model_list(path, what).entries}


def parse_models(
    items: Any, lines: dict[Loc, int], origin: str, base: Path, key: str = LIST_KEY
) -> tuple[ModelEntry, ...]:
    """The entries of the list `items` found under `key` of a file (`lines`: its key lines, for
    the messages), files named in them made absolute against `base`, each checked (module
    docstring)."""
    at = _at(lines, origin, key)
    try:
        raw = _Listed.model_validate({"models": items}).models
        expanded = [(i, e) for i, r in enumerate(raw) for e in r.entries()]
    except ValidationError as err:
        raise UserError(problem(err, lines, origin, key)) from None
    seen: dict[tuple[str, str | None, str | None], int] = {}
    for i, entry in expanded:
        if entry.key in seen:
            raise UserError(
                f"{at((i, 'name'))}: {entry.name} is listed twice alike (same weights and "
                f"recipe as {key}[{seen[entry.key]}]); list each model once"
            )
        seen[entry.key] = i
    entries = [(i, with_paths(e, base)) for i, e in expanded]
    check_models(entries, at)
    return tuple(e for _, e in entries)


def _at(lines: dict[Loc, int], origin: str, key: str) -> Callable[[Loc], str]:
    """`<origin> line N: key.i.field` of a place in the list (the entry's line where the field
    is not written)."""

    def at(loc: Loc) -> str:
        full = (key, *loc)
        line = next((lines[full[:n]] for n in range(len(full), 0, -1) if full[:n] in lines), 1)
        return f"{origin} line {line}: {'.'.join(map(str, full))}"

    return at


def with_paths(entry: ModelEntry, base: Path) -> ModelEntry:
    """A checkpoint or recipe file named relative to the list's folder, made absolute (a study
    runs in its own folder)."""
    changes = {}
    weights = entry.weights
    if weights is not None and weights not in WEIGHT_WORDS and is_path(weights, base):
        changes["weights"] = str((base / weights).resolve())
    if entry.recipe is not None and _recipe_is_file(entry.recipe):
        changes["recipe"] = str((base / entry.recipe).resolve())
    return entry.model_copy(update=changes)


def is_path(weights: str, base: Path) -> bool:
    """Whether `weights` names a file (rather than a word or named source)."""
    return "/" in weights or "\\" in weights or (base / weights).is_file()


def _recipe_is_file(recipe: str) -> bool:
    """As `recipe/builtin.py: load_recipe` tells a file from a built-in name."""
    return "/" in recipe or "\\" in recipe or recipe.endswith((".yaml", ".yml"))


def check_models(entries: Sequence[tuple[int, ModelEntry]], at: Callable[[Loc], str]) -> None:
    """Every model known to timm, every recipe loadable and every checkpoint file present, so a
    list that would fail in its studies fails as it is read, `--dry-run` too; `at((i, field))`
    names entry i's field. Imports torch and timm."""
    from quantstudy.model.loading import check_model_name

    for i, entry in entries:
        _refused(check_model_name, entry.name, at((i, "name")))
        if entry.recipe is not None:
            _refused(load_recipe, entry.recipe, at((i, "recipe")))
        if entry.weights is not None:
            check_weights(entry.weights, at((i, "weights")))


def check_weights(weights: str, where: str) -> None:
    """`weights` names random or cached weights, a named source or a checkpoint file that is
    there (`where` says whose); imports torch."""
    from quantstudy.model.loading import NAMED_SOURCES

    if weights in WEIGHT_WORDS or weights in NAMED_SOURCES:
        return
    kind = not_a_file(weights)
    if kind is not None:
        said = "does not exist" if kind == "missing" else f"is {kind}, not a file"
        raise UserError(
            f"{where}: checkpoint {weights} {said} (files are relative to the list); give a "
            f"checkpoint file, 'cache', 'random' or a named source "
            f"({', '.join(sorted(NAMED_SOURCES))})"
        )


def _refused(check: Callable[[str], object], value: str, where: str) -> None:
    """`check(value)`, its `UserError` said at `where`."""
    try:
        check(value)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None


def parse_model_args(texts: Sequence[str]) -> tuple[ModelEntry, ...]:
    """`model[:recipe]` arguments (`bench products`) as entries, checked as a list file's are;
    a mistake names the argument."""
    if not texts:
        raise UserError("no model given: name at least one model[:recipe]")
    entries = []
    for text in texts:
        name, _, recipe = text.partition(":")
        try:
            entries.append(ModelEntry(name=name, recipe=recipe or None))
        except ValidationError:
            raise UserError(
                f"{text!r}: give model[:recipe], e.g. resnet50:generic_dense_convs"
            ) from None
    twice = next((texts[i] for i, e in enumerate(entries) if e in entries[:i]), None)
    if twice is not None:
        raise UserError(f"{twice!r} is given twice; name each model[:recipe] once")
    check_models(list(enumerate(entries)), lambda loc: f"argument {texts[int(loc[0])]!r}")
    return tuple(entries)


def problem(err: ValidationError, lines: dict[Loc, int], origin: str, key: str = "") -> str:
    """The first problem pydantic found in a list (or a file holding one) as `<origin> line N:
    <key path>: <what is wrong>`; `key`: the list's key, named where the error's path starts
    at the list's `models`."""
    first = err.errors(include_url=False)[0]
    loc: Loc = tuple(first["loc"])
    if key and loc[:1] == (LIST_KEY,):
        loc = (key, *loc[1:])
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), 1)
    where = ".".join(str(p) for p in loc) or "top level"
    kind = first["type"]
    if kind == "extra_forbidden":
        known = ", ".join(f for f in ModelEntry.model_fields)
        message = f"unknown key {loc[-1]!r} (known: {known})"
    elif kind == "missing":
        message = f"required key {loc[-1]!r} is missing"
    elif kind == "too_short":
        message = "is empty: list at least one"
    elif kind in ("literal_error", "enum"):
        expected = first.get("ctx", {}).get("expected", "")
        message = f"{first['input']!r} is not allowed (known: {expected})"
    else:
        message = str(first["msg"]).removeprefix("Value error, ")
        if kind != "value_error":
            message += f" (got {first['input']!r})"
    return f"{origin} line {line}: {where}: {message}"
