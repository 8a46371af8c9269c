"""Load a script of the repository's `tools/` (not part of the installed package) as a module."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(relative: str) -> ModuleType:
    """`tools/<relative>` as a module; its folder goes on `sys.path`, as when it runs as a script
    (a tool may import its sibling scripts)."""
    path = TOOLS / relative
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"tools_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
