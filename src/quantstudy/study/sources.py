"""The hash of the code that makes a measurement's numbers, so a measurement can say "same code"
without naming a commit: a zoo row measured under another hash is stale (`zoo/row_files.py`), and
a peers row joins a record of rows measured under its hash (`bench/peers/alike.py`).

What is hashed is what the code computes, not its bytes (`record/code_digest.py`): each `.py`
file's syntax tree without docstrings (comments and layout are not in it), each `.yaml` file's
data. A reworded docstring, a comment or a reflowed line keeps every row fresh; a changed
constant, name or statement makes them stale. Rows hashed by bytes, before this, read stale
with that reason (`HASHED_BY`, `zoo/row_files.py: stale_reasons`).

What `ENGINE_SOURCES` covers, by path under `quantstudy/`, every `.py` and `.yaml` file inside:
- `quant/`: the FP8 kernels, their tile tables and tuning, the FP8 layers, the plan and rewrites;
- `engines/`: how the fp16 and FP8 engines are assembled and compiled (Inductor settings);
- `speed/`: the timing harness and the figures it derives (x, its quartiles, the ideal);
- `model/`: model loading and the BatchNorm folding both engines run on;
- `recipe/`: the built-in recipes and their resolution, which decide the layers FP8 runs.
Left out on purpose: the rest of `study/`, `record/`, `report/` and the others order the stages,
store and show the numbers, so a change there does not change a timing; the installed torch,
Triton and the GPU are checked apart (the zoo's `rows.stale_reasons`, the peers' `check_alike`).
The shipped tuning tables (`quant/kernels/tables/*.json`) are left out too: a table entry is
used only under the kernel source it was tuned for, and a tile changes no number, only a time.
A caller whose numbers come from more code names it (`engine_sources_sha256(covered=...)`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from quantstudy.record.code_digest import file_form

ENGINE_SOURCES = ("quant", "engines", "speed", "model", "recipe")
PACKAGE = Path(__file__).resolve().parent.parent

# How a hash of the engine sources was made: "bytes" (each file's bytes, every hash before the
# syntax-tree one, and so what a row that does not say means) or "ast" (`file_form`).
SourcesHash = Literal["bytes", "ast"]
HASHED_BY: SourcesHash = "ast"  # how `engine_sources_sha256` hashes


def engine_sources_sha256(root: Path = PACKAGE, covered: Sequence[str] = ENGINE_SOURCES) -> str:
    """SHA-256 over each covered file's path (relative to `root`) and what it computes
    (`record/code_digest.py: file_form`), in path order; `covered`: folders (every `.py` and
    `.yaml` file inside) and files, relative to `root`."""
    digest = hashlib.sha256()
    files = sorted(
        {
            p
            for part in covered
            for p in ([root / part] if (root / part).is_file() else (root / part).rglob("*"))
            if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
        }
    )
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file_form(path) + b"\0")
    return digest.hexdigest()
