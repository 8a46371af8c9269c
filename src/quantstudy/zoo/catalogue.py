"""The zoo's list of models (`models.yaml` in this folder, or the user's own file) and its shards.

A shard is every N-th entry from the I-th (`--shard I/N`, 1-based), so each shard mixes
families and model sizes and N shards of one list take about the same time: a list that needs
an hour on one GPU runs as N commands of an hour / N each.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quantstudy.recipe.schema import compose_yaml, key_lines
from quantstudy.record.errors import UserError
from quantstudy.record.readers import decode_utf8, read_bytes

DEFAULT_LIST = Path(__file__).with_name("models.yaml")
T = TypeVar("T")
# `quantstudy zoo --weights`: random for every model (speed only), or real where present
WeightsMode = Literal["random", "cache"]


class ZooEntry(BaseModel):
    """One model of the list."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)  # timm name, optionally with pretrained tag
    family: str = Field(min_length=1)
    weights: str | None = None  # real weights here: a named source or a checkpoint file
    recipe: str | None = None  # None: the study's default for the model


class ZooList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[ZooEntry] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[ZooEntry]) -> list[ZooEntry]:
        names = [m.name for m in models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is listed twice; list each model once")
        return models


@dataclass(frozen=True)
class Catalogue:
    """A read list: its entries (checkpoint paths made absolute), where it came from, its hash."""

    entries: list[ZooEntry]
    source: str
    sha256: str


def load_catalogue(path: Path | None = None) -> Catalogue:
    """The list at `path` (default: the committed one); a mistake is a `UserError` with its line."""
    path = path or DEFAULT_LIST
    origin = str(path)
    if not path.is_file():
        raise UserError(f"zoo list {origin} does not exist; check the path")
    data_bytes = read_bytes(path, "config", "zoo list")
    root, data = compose_yaml(decode_utf8(data_bytes, f"zoo list {origin}"), origin)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise UserError(f"{origin} line 1: a zoo list is a mapping with the key models")
    lines = key_lines(root, ())
    try:
        parsed = ZooList.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = tuple(first["loc"])
        line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), 1)
        where = ".".join(str(p) for p in loc) or "top level"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise UserError(f"{origin} line {line}: {where}: {message}") from None
    from quantstudy.model.loading import check_listed_models  # imports torch: once it is valid

    names = [m.name for m in parsed.models]
    check_listed_models(names, lambda i: f"{origin} line {lines[('models', i)]}: models.{i}.name")
    entries = [_with_paths(e, path.parent) for e in parsed.models]
    return Catalogue(entries, origin, hashlib.sha256(data_bytes).hexdigest())


def _with_paths(entry: ZooEntry, base: Path) -> ZooEntry:
    """A checkpoint file or recipe file named relative to the list, made absolute."""
    changes = {}
    if entry.weights is not None and ("/" in entry.weights or (base / entry.weights).is_file()):
        changes["weights"] = str((base / entry.weights).resolve())
    if entry.recipe is not None and ("/" in entry.recipe or entry.recipe.endswith(".yaml")):
        changes["recipe"] = str((base / entry.recipe).resolve())
    return entry.model_copy(update=changes)


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def take(self, items: list[T]) -> list[T]:
        """Every `count`-th item from the `index`-th."""
        return items[self.index - 1 :: self.count]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


ALL = Shard(1, 1)


def parse_shard(text: str) -> Shard:
    """`I/N` with 1 <= I <= N, as `--shard` takes it."""
    head, sep, tail = text.partition("/")
    if not (sep and head.isdigit() and tail.isdigit() and 1 <= int(head) <= int(tail)):
        raise UserError(f"--shard {text}: give I/N with 1 <= I <= N, e.g. --shard 2/4")
    return Shard(int(head), int(tail))
