"""Every name of the package has one import path, so a reader searching for its users finds them.

A name is imported from the module that defines it, or from the one module that re-exports it
(lists it in its `__all__` without defining it): `quantstudy.record` for the record's sections,
`quant/backends/base.py` for what a backend declares. Only the re-exporter itself, and for a
package's `__init__.py` the modules inside that package, import such a name from where it is
defined. A module that merely happens to import a name is no path to it. The package root's lazy
exports (`quantstudy.StudyConfig`, docs/api.md) are the user's API and are not read here.
Checked over the Python of src/, tests/, tools/ and examples/ (docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
READ = ("src", "tests", "tools", "examples")


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Package:
    """What each module of src/quantstudy defines, imports and re-exports (top level only)."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}
        self.defined: dict[str, set[str]] = {}
        self.imported: dict[str, dict[str, tuple[str, str]]] = {}
        self.exported: dict[str, set[str]] = {}
        for path in sorted((SRC / "quantstudy").rglob("*.py")):
            self._read(_module(path), path)

    def _read(self, module: str, path: Path) -> None:
        self.files[module] = path
        defined, imported, exported = set(), {}, set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                defined |= names
                if "__all__" in names and isinstance(node.value, ast.List | ast.Tuple):
                    exported = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
        self.defined[module] = defined
        self.imported[module] = imported
        self.exported[module] = {n for n in exported if n in imported}

    def origin(self, module: str, name: str) -> tuple[str, str] | None:
        """(defining module, name) of `from module import name`; None for a module or outside."""
        for _ in range(10):
            if name in self.defined.get(module, ()):
                return module, name
            if f"{module}.{name}" in self.files or name not in self.imported.get(module, {}):
                return None
            module, name = self.imported[module][name]
        return None

    def re_exporters(self) -> dict[tuple[str, str], list[str]]:
        """Each re-exported name's origin -> the modules that re-export it (the root left out)."""
        found: dict[tuple[str, str], list[str]] = defaultdict(list)
        for module, names in self.exported.items():
            for name in names:
                origin = self.origin(module, name)
                if module != "quantstudy" and origin is not None:
                    found[origin].append(module)
        return found


def _inside(path: Path, module: str, files: dict[str, Path]) -> bool:
    """Whether `path` is the module itself or, for a package, a file inside it."""
    own = files[module]
    return path == own or (own.name == "__init__.py" and own.parent in path.parents)


def _read_files() -> list[Path]:
    paths = [p for root in READ for p in sorted((REPO / root).rglob("*.py"))]
    return [p for p in paths if p != SRC / "quantstudy" / "__init__.py" and ".venv" not in p.parts]


def _wrong_paths(package: Package, paths: list[Path]) -> list[str]:
    """Each import of another path, as "file:line: name from the module it should come from"."""
    exporters = package.re_exporters()
    wrong = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.split(".")[0] != "quantstudy" or node.module == "quantstudy":
                continue
            for alias in node.names:
                origin = package.origin(node.module, alias.name)
                if origin is None:
                    continue
                via = exporters.get(origin, [])
                want = via[0] if via and not _inside(path, via[0], package.files) else origin[0]
                if node.module != want:
                    wrong.append(f"{path.name}:{node.lineno}: {alias.name} from {want}")
    return wrong


def test_no_name_is_re_exported_twice() -> None:
    twice = {o: ms for o, ms in Package().re_exporters().items() if len(ms) > 1}
    assert not twice, f"names re-exported by several modules: {twice}"


def test_every_name_is_imported_through_its_one_path() -> None:
    package = Package()
    assert package.re_exporters()[("quantstudy.record.inputs", "StudyConfig")] == [
        "quantstudy.record"
    ]  # it looked
    wrong = _wrong_paths(package, _read_files())
    assert not wrong, "imports through another path than the one (file:line: name from):\n" + (
        "\n".join(wrong)
    )


def test_the_check_finds_each_kind_of_other_path(tmp_path: Path) -> None:
    """The check above would pass on any tree if it never followed an import: through a
    bystander (a module that imports the name without re-exporting it), from the defining
    module of a re-exported name, and the right paths pass."""
    user = tmp_path / "user.py"
    user.write_text(
        "from quantstudy.decision.policy import Policy\n"
        "from quantstudy.record.inputs import StudyConfig\n"
        "from quantstudy.record import StudyRecord\n"
        "from quantstudy.decision.schema import QualityPolicy\n"
        "from quantstudy.record.errors import UserError\n",
        encoding="utf-8",
    )
    assert _wrong_paths(Package(), [user]) == [
        "user.py:1: Policy from quantstudy.decision.schema",
        "user.py:2: StudyConfig from quantstudy.record",
    ]
