"""The package's import structure: each stage imports only from stages below it, no cycles.

The layers, bottom to top (docs/DESIGN.md explains each). A module may import from its own
subpackage and from any lower layer; an import from the same or a higher layer fails here, so
an uphill import cannot land unnoticed. Inside every package, its modules and subpackages
import each other without a circle, and nothing imports the package root (it sits above every
stage: its lazy entry points import them). Also the size limits: no source file of src/ or
tools/ over 400 lines, no function over 80 (a Triton kernel included).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import quantstudy

LAYERS: list[set[str]] = [
    {"env"},
    {"record", "cli_base", "gpu"},
    {"model", "data", "recipe", "quant"},
    {"engines", "quality"},
    {"speed"},
    {"decision"},
    {"report"},
    {"study"},
    {"search", "bench", "sweep", "bridge"},
    {"package", "zoo"},
    {"api", "cli_crash"},
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
            if len(parts) == 1:
                continue  # the package root: `test_nothing_imports_the_package_root`
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


def test_record_imports_nothing_but_the_environment() -> None:
    """The record is the ground every stage writes into: below it only the lab switches it
    names (`env/switches.py`), which import nothing of quantstudy."""
    assert not [w for s, d, w in _edges() if s == "record" and d != "env"]
    assert not [w for s, _, w in _edges() if s == "env"]


def test_layers_name_every_subpackage() -> None:
    parts = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    for part in parts - {"__init__", "__pycache__"}:
        _level(part)


def _targets(path: Path) -> list[tuple[int, str]]:
    """(line, dotted target) of every quantstudy import in `path`: `from a.b import c` gives
    a.b.c, so that importing a submodule by name from its package counts as importing it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] == "quantstudy"]
    return found


def _package_graphs() -> dict[str, dict[str, set[str]]]:
    """For every package (the root and each directory with an `__init__.py`): which of its
    direct children (modules and subpackages) imports which other, through any file inside."""
    graphs: dict[str, dict[str, set[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("").parts
        for depth in range(len(rel) - 1 if rel[-1] == "__init__" else len(rel)):
            package = ".".join(("quantstudy", *rel[:depth]))
            child = rel[depth]
            graph = graphs.setdefault(package, {})
            graph.setdefault(child, set())
            for _, target in _targets(path):
                parts = target.split(".")
                if ".".join(parts[: depth + 1]) == package and len(parts) > depth + 1:
                    if parts[depth + 1] != child:
                        graph[child].add(parts[depth + 1])
    return graphs


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (importer -> imported), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_circle_finder_finds_a_circle() -> None:
    """The check below would pass on any graph if `_circle` never found one."""
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) is not None
    assert _circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_inside_any_package() -> None:
    graphs = _package_graphs()
    assert "quantstudy.quant" in graphs and graphs["quantstudy.quant"]["plan"]  # it looked
    circles = {p: c for p, g in graphs.items() if (c := _circle(g)) is not None}
    assert not circles, "import circles (package: modules in the circle):\n" + "\n".join(
        f"{p}: {' -> '.join(c)}" for p, c in circles.items()
    )


def test_nothing_imports_the_package_root() -> None:
    """`import quantstudy` or `from quantstudy import X` (X not a subpackage) from inside the
    package is an uphill import to the top floor; `__version__` lives in record/version.py."""
    children = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    uphill = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "__init__.py"
        for line, target in _targets(path)
        if target == "quantstudy"
        or (target.count(".") == 1 and target.split(".")[1] not in children)
    ]
    assert not uphill, "imports of the package root:\n" + "\n".join(uphill)


MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
TOOLS = ROOT.parents[1] / "tools"
# Over the limits today, each in an area another change owns; remove an entry when it is split.
# The test fails if one grows, or once it fits (so the entry cannot outlive the split).
KNOWN_LONG: dict[str, int] = {}


def _sizes() -> dict[str, int]:
    """Line counts of every source file of the package and of tools/ ("tools/..."), and of every
    function over the limit ("file:name")."""
    sizes = {}
    paths = [(p, str(p.relative_to(ROOT))) for p in sorted(ROOT.rglob("*.py"))]
    paths += [(p, f"tools/{p.relative_to(TOOLS)}") for p in sorted(TOOLS.rglob("*.py"))]
    for path, rel in paths:
        text = path.read_text(encoding="utf-8")
        sizes[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    sizes[f"{rel}:{node.name}"] = max(n, sizes.get(f"{rel}:{node.name}", 0))
    return sizes


@pytest.mark.parametrize("limit", ["files", "functions"])
def test_no_file_or_function_over_the_limit(limit: str) -> None:
    is_function = limit == "functions"
    cap = MAX_FUNCTION_LINES if is_function else MAX_FILE_LINES
    sizes = _sizes()
    over = {
        k: n
        for k, n in sizes.items()
        if (":" in k) == is_function and n > cap and KNOWN_LONG.get(k) != n
    }
    assert not over, f"{limit} over {cap} lines: {over}"
    fitted = [
        k for k, n in KNOWN_LONG.items() if (":" in k) == is_function and _sizes().get(k) != n
    ]
    assert not fitted, f"KNOWN_LONG entries that changed size (update or remove): {fitted}"
