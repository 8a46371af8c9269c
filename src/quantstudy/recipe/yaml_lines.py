"""YAML errors that name the file line: the node tree's marks as the line of every key, and a
pydantic validation error explained at its line with the keys the mapping knows.

Shared by every YAML file the tool reads (recipes, sweeps, model lists), so their errors name
lines alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from quantstudy.record.readers import parse_yaml

# Where in a YAML document: keys and list indices from the top (pydantic's error `loc` too).
Loc = tuple[str | int, ...]


def compose_yaml(text: str, origin: str) -> tuple[yaml.Node | None, object]:
    """The node tree (for line numbers) and the data of YAML `text`, by the tool's one strict
    YAML reader (`record/readers.py`: no aliases, bounded nesting); mistakes are a `UserError`
    naming `origin` and, where the parser knows it, the line."""
    return parse_yaml(text, origin)


def key_lines(node: yaml.Node, path: Loc) -> dict[Loc, int]:
    """Line (1-based) of every mapping key and list item, by path (a repeated key was refused
    by the reader)."""
    lines: dict[Loc, int] = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else key_node.tag
            lines.update(key_lines(value_node, (*path, key)))
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(key_lines(item, (*path, i)))
    return lines


def line_for(loc: Loc, lines: dict[Loc, int]) -> int | None:
    """Line of the longest prefix of `loc` that exists in the file."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def loc_path(loc: Loc) -> str:
    """`loc` as a reader writes it: `rules[2].include.name_glob`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` of a `root` document (to list its
    known keys)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # a list item: the list's item model is already current
        if model is None or part not in model.model_fields:
            return None
        model = _find_model(model.model_fields[part].annotation)
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def explain(
    err: ValidationError,
    lines: dict[Loc, int],
    origin: str,
    root: type[BaseModel],
    nouns: Mapping[type[BaseModel], str],
) -> str:
    """The first validation problem of a `root` document as `<file> line N: <path>: <what is
    wrong and how to fix>`; an unknown key of a mapping that `nouns` names is called so."""
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    line = line_for(loc, lines)
    at = f"{origin} line {line}" if line is not None else origin
    kind = first["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        model = _model_at(root, parent)
        known = ", ".join(model.model_fields) if model is not None else "?"
        what = nouns.get(model, "key") if model is not None else "key"
        message = f"{loc_path(parent)}: unknown {what} {key!r} (known: {known})"
    elif kind == "missing":
        message = f"{loc_path(loc[:-1])}: required key {loc[-1]!r} is missing"
    elif kind.startswith("literal_error"):
        expected = first.get("ctx", {}).get("expected", "")
        message = f"{loc_path(loc)}: {_short(first['input'])} is not allowed (known: {expected})"
    elif kind == "value_error":  # raised by our validators, which name the bad value themselves
        message = f"{loc_path(loc)}: {str(first['msg']).removeprefix('Value error, ')}"
    else:
        message = f"{loc_path(loc)}: {first['msg']} (got {_short(first['input'])})"
    more = len(errors) - 1
    return f"{at}: {message}" + (f" [and {more} more problem(s)]" if more else "")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
