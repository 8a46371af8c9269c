"""What a Python source computes, as text to hash: its syntax tree with the docstrings of the
module, its classes and functions removed (comments and layout are gone from a tree already).

A hash of source bytes changes with a reworded docstring or a moved comment, so every
measurement it stamps would read stale after an edit that changes no number; the tree changes
only where a name, a constant, an annotation or a statement does. Used for the engine sources
of a measurement (`study/sources.py`) and the kernel source a tuned choice was made for
(`quant/kernels/kernel_source.py`).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import yaml

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` (changed in place) without the docstrings of its module, classes and functions;
    a body that held only its docstring holds `pass`, as the code behaves."""
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED) and node.body and _is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def computed_form(tree: ast.AST) -> str:
    """`tree` as text without docstrings, line numbers or columns."""
    return ast.dump(strip_docstrings(tree), include_attributes=False)


def python_form(source: str) -> str:
    """What the Python `source` computes (`computed_form` of its parsed tree)."""
    return computed_form(ast.parse(source))


def file_form(path: Path) -> bytes:
    """What the file at `path` computes: a `.py` file's tree, a `.yaml` file's data (its
    comments and layout dropped); any other file, or one that does not parse, its bytes."""
    raw = path.read_bytes()
    try:
        if path.suffix == ".py":
            return python_form(raw.decode()).encode()
        if path.suffix == ".yaml":
            data: Any = yaml.safe_load(raw)
            return json.dumps(data, sort_keys=True, default=str).encode()
    except (SyntaxError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        pass  # a file that does not parse: its bytes, so an edit still shows
    return raw
