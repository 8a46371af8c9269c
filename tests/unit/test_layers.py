"""The package's import structure: each stage imports only from stages below it, no cycles.

The layers, bottom to top (docs/DESIGN.md explains each). A module may import from its own
subpackage and from any lower layer; an import from the same or a higher layer fails here, so
an uphill import cannot land unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import quantstudy

LAYERS: list[set[str]] = [
    {"record"},
    {"model", "data", "recipe", "quant"},
    {"engines", "quality"},
    {"speed"},
    {"decision"},
    {"report"},
    {"study"},
    {"search", "bench", "sweep", "bridge"},
    {"package"},
    {"cli", "__main__"},
]
ROOT = Path(quantstudy.__file__).parent


def _level(part: str) -> int:
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"subpackage {part!r} has no layer: add it to LAYERS and DESIGN.md")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every quantstudy import in `path`, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] == "quantstudy"]
    return found


def _edges() -> list[tuple[str, str, str]]:
    """(importer subpackage, imported subpackage, where) for every cross-subpackage import."""
    edges = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue  # the package root: lazy entry points only
        src = rel.parts[0].removesuffix(".py")
        for line, module in _imports(path):
            parts = module.split(".")
            if len(parts) == 1 or parts[1] == "__version__":
                continue  # `import quantstudy` for __version__
            dst = parts[1]
            if dst != src:
                edges.append((src, dst, f"{rel}:{line} imports {module}"))
    return edges


# Imports known to run uphill, each to be removed by the change that fixes it. Keep it empty.
KNOWN_UPHILL: set[str] = set()


def test_every_import_runs_downhill() -> None:
    uphill = [
        w
        for s, d, w in _edges()
        if _level(d) >= _level(s) and w.split(":")[0] + w[w.index(" imports") :] not in KNOWN_UPHILL
    ]
    assert not uphill, "imports from the same or a higher layer:\n" + "\n".join(uphill)


def test_record_imports_nothing_else_of_the_package() -> None:
    assert not [w for s, _, w in _edges() if s == "record"]


def test_layers_name_every_subpackage() -> None:
    parts = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    for part in parts - {"__init__", "__pycache__"}:
        _level(part)
