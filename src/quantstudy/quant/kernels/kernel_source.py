"""The source a tuned choice was made for, hashed by what it computes: a kernel's syntax tree
without docstrings (`record/code_digest.py`), with each Triton function it calls, transitively,
and the value of each module-level constant it reads.

A shipped tuning table (`table.py`) holds a choice only under this hash, so an edit of one
kernel makes only that kernel's entries stale, and a reworded docstring or a comment none.
Triton's own `cache_key` is not used: it hashes source bytes (docstrings included), and so
would stale a table at every comment. What a tile means also depends on the config list and
the prune, which live outside the kernel: a table's config is used only where today's prune
keeps it (`table.lookup`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import textwrap
from typing import Any

from quantstudy.record.code_digest import computed_form

_CONSTANTS = (int, float, bool, str, bytes, type(None))


def _python_function(obj: Any) -> Any:
    """The Python function of a Triton kernel (its `fn`); None for anything else."""
    fn = getattr(obj, "fn", None)
    return fn if inspect.isfunction(fn) else None


def _dotted_names(tree: ast.AST) -> set[tuple[str, ...]]:
    """Every name the tree reads, with the attributes read off it (`fp8.E4M3_MAX`)."""
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            found.add((node.id, *reversed(chain)))
    return found


def _resolve(path: tuple[str, ...], scope: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each prefix of `path` found in `scope` (a module's globals) and what it names."""
    if path[0] not in scope:
        return []
    value, found = scope[path[0]], [(path[0], scope[path[0]])]
    for attr in path[1:]:
        try:
            value = getattr(value, attr)
        except AttributeError:
            break
        found.append((".".join(path[: len(found) + 1]), value))
    return found


def _parts(fn: Any, seen: set[Any], out: list[str]) -> None:
    """`fn`'s computed form, then that of each Triton function and constant it reads."""
    if fn in seen:
        return
    seen.add(fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    out.append(f"def {fn.__qualname__}: {computed_form(tree)}")
    for path in sorted(_dotted_names(tree)):
        for name, value in _resolve(path, fn.__globals__):
            called = _python_function(value)
            if called is not None:
                _parts(called, seen, out)
            constant = getattr(value, "value", value)  # tl.constexpr holds its value
            if isinstance(constant, _CONSTANTS):
                out.append(f"{name} = {constant!r}")


@functools.cache
def kernel_source_sha(kernel: Any) -> str:
    """SHA-256 of what `kernel` (a Triton kernel, or anything with a Python `fn`) computes,
    with what it calls and reads; once per kernel in a process."""
    fn = _python_function(kernel)
    if fn is None:
        raise TypeError(f"{kernel!r} has no Python function (`fn`) to hash")
    out: list[str] = []
    _parts(fn, set(), out)
    return hashlib.sha256("\n".join(out).encode()).hexdigest()
