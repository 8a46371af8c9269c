"""One strict reader for every file the tool reads: recipes, policies, sweeps (YAML), records,
caches and trtexec exports (JSON), class lists (text).

A file is read only if it is small enough for what it is (`LIMITS`: a hostile or mistaken file
must not exhaust memory before it is judged), is UTF-8, and parses without the constructs that
make a small file expand without bound. Every refusal is a `UserError` of one line naming the
file; nothing here raises a traceback for a bad file.

- YAML: `StrictLoader`, PyYAML's `SafeLoader` that refuses aliases (`*name`). An alias is the
  only way a YAML document grows beyond its text (ten nested aliases of ten items each are
  10^10 nodes from a few hundred bytes, the "billion laughs"); no file the tool reads needs one,
  so the first alias is refused with its line before anything is built. Nesting deeper than
  Python's recursion allows is refused too, rather than crashing the composer. A key repeated
  in one mapping is refused with its line, as in JSON below (PyYAML keeps the last value).
- JSON: the standard parser, with repeated keys refused (the parser keeps the last one
  silently, so an edited record could show one value and be checked on another) and nesting
  too deep for the parser refused in one line.
- Numbers: a file a user writes (a recipe, policy, sweep or study config, a gains file) holds
  finite numbers only: YAML's `.nan`/`.inf`, JSON's `NaN`/`Infinity` and a literal too large
  for a float (`1e999`) are refused naming the value (and the line, in YAML); each would pass
  a range check (NaN compares false) or turn every sum it enters into NaN. A record may hold
  NaN (a metric of an engine whose logits were not finite), and a trtexec export is checked
  field by field (`bridge/trt_json.py`), so those two readers take any number.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import yaml

from quantstudy.record.errors import UserError

MiB = 1 << 20
# Largest file of each kind the tool reads, in bytes. Each is far above any real file of its
# kind (a recipe or policy is a few KiB; a 21k-class list about 1 MiB; a study of the 50,000
# ImageNet validation images records their IDs, a few MiB), and far below what would exhaust
# a machine's memory once parsed.
LIMITS = {
    "config": 1 * MiB,  # recipe, policy, sweep file
    "class list": 16 * MiB,
    "record": 256 * MiB,  # study.json, sweep point status
    "json": 256 * MiB,  # trtexec exports, gains, caches
}


def not_a_file(path: Path | str) -> str | None:
    """What `path` is when it is not a regular file (through symbolic links): "missing", "a
    broken symbolic link", "a folder", "a named pipe", "a socket", "a device file", "a special
    file" or "cannot be examined: <reason>"; None for a regular file. It looks, never opens: a
    named pipe would block its reader (and Ctrl-C with it) until a writer came, and a device
    file could be read without end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.lexists(path) else "missing"
    except OSError as e:
        return f"cannot be examined: {e.strerror or e}"
    return _kind(mode)


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def refuse_not_a_file(path: Path | str, what: str) -> None:
    """A `UserError` of one line naming `path` and what it is, unless it is a regular file:
    every reader of a file a user names calls this before opening it (`not_a_file`)."""
    kind = not_a_file(path)
    if kind is None:
        return
    if kind == "missing":
        raise UserError(f"cannot read {what} {path}: it does not exist; check the path")
    if kind.startswith("cannot"):
        raise UserError(f"cannot read {what} {path}: it {kind}")
    raise UserError(f"cannot read {what} {path}: it is {kind}, not a file; name a file")


def read_bytes(path: Path | str, kind: str, what: str) -> bytes:
    """The bytes of `path` (`what` names it in messages), refused in one line when it is not a
    regular file (`refuse_not_a_file`), is larger than `LIMITS[kind]` or cannot be read."""
    path = Path(path)
    limit = LIMITS[kind]
    too_big = f"a {kind} file is at most {limit // MiB} MiB: check it is the file you meant"
    refuse_not_a_file(path, what)
    try:
        # non-blocking, and checked again once open: a file swapped for a pipe since the look
        # is refused rather than waited on
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            found = os.fstat(f.fileno())
            if (swapped := _kind(found.st_mode)) is not None:
                raise UserError(f"cannot read {what} {path}: it is {swapped}, not a file")
            size = found.st_size
            if size > limit:
                raise UserError(f"{what} {path} is {size / MiB:.1f} MiB; {too_big}")
            data = f.read(limit + 1)  # a file that grows while read is still bounded
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise UserError(f"{what} {path} is over {limit // MiB} MiB; {too_big}")
    return data


def read_text(path: Path | str, kind: str, what: str, *, bom: bool = False) -> str:
    """`read_bytes` as UTF-8 text, refused in one line when it is not UTF-8. `bom`: drop a
    byte-order mark."""
    return decode_utf8(read_bytes(path, kind, what), f"{what} {path}", bom=bom)


def decode_utf8(data: bytes, origin: str, *, bom: bool = False) -> str:
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{origin} is not UTF-8 text ({e.reason}); save it as UTF-8") from None


class StrictLoader(yaml.SafeLoader):
    """`SafeLoader` that refuses aliases: the first `*name` is a `yaml.MarkedYAMLError`."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor} found: anchors and aliases are not accepted (an alias "
                "can expand a small file without bound); write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise RepeatedKeyError(key, key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


class RepeatedKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one mapping: PyYAML would keep the last value without a word, so a
    file could read one way to its author and another to the tool."""

    def __init__(self, key: Any, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r}; keep one", mark)


def parse_yaml(text: str, origin: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for line numbers) and the data of YAML `text`, by `StrictLoader`; a
    malformed, aliased or too deeply nested document is a `UserError` naming `origin` and,
    where the parser knows it, the line."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
        _refuse_non_finite(loader, node)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        what = "" if isinstance(err, (RepeatedKeyError, NonFiniteError)) else "malformed YAML: "
        raise UserError(f"{origin}{line}: {what}{err.problem or err}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{origin}: malformed YAML: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise UserError(f"{origin}: YAML nested too deeply to read; flatten it") from None
    finally:
        loader.dispose()
    return node, data


class NonFiniteError(yaml.constructor.ConstructorError):
    """A float that is not finite (`.nan`, `.inf`, `1e999`): no setting means one."""

    def __init__(self, node: yaml.ScalarNode) -> None:
        super().__init__(
            None, None, f"{node.value} is not a finite number; write one", node.start_mark
        )


def _refuse_non_finite(loader: StrictLoader, root: yaml.Node | None) -> None:
    """The first float of the document (in file order) that is not finite, as a
    `yaml.MarkedYAMLError` at its line."""
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:float":
            if not math.isfinite(loader.construct_yaml_float(node)):
                raise NonFiniteError(node)
        elif isinstance(node, yaml.SequenceNode):
            stack += reversed(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack += [n for pair in reversed(node.value) for n in reversed(pair)]


def _no_repeated_keys(origin: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise UserError(f"{origin} is not valid JSON: key {key!r} repeated in one object")
            out[key] = value
        return out

    return pairs


def parse_json(text: str, origin: str, *, finite: bool = True) -> Any:
    """The data of JSON `text`; malformed JSON, a repeated key, nesting too deep for the parser
    or (`finite`) a number that is not finite is a `UserError` naming `origin`."""

    def number(literal: str) -> float:
        if not math.isfinite(value := float(literal)):
            raise UserError(f"{origin}: {literal} is not a finite number; write one")
        return value

    checks: dict[str, Any] = {"parse_constant": number, "parse_float": number} if finite else {}
    try:
        return json.loads(text, object_pairs_hook=_no_repeated_keys(origin), **checks)
    except json.JSONDecodeError as e:
        raise UserError(f"{origin} is not valid JSON: {e}") from None
    except RecursionError:
        raise UserError(f"{origin} is not valid JSON: nested too deeply to read") from None


def read_json(
    path: Path | str, what: str, kind: str = "json", *, finite: bool | None = None
) -> Any:
    """`read_text` then `parse_json`: the one way a JSON file is read. `finite`: refuse a number
    that is not finite (default: in every kind of file but a record, module docstring)."""
    finite = kind != "record" if finite is None else finite
    return parse_json(read_text(path, kind, what), f"{what} {path}", finite=finite)
