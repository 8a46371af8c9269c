"""The hash of the code that builds and times a study's engines: a zoo row measured under another
hash is stale, so a run measures it again (`zoo/rows.py`).

What the hash covers, by subpackage of `quantstudy`, every `.py` and `.yaml` file inside:
- `quant/`: the FP8 kernels, their tile tables and tuning, the FP8 layers, the plan and rewrites;
- `engines/`: how the fp16 and FP8 engines are assembled and compiled (Inductor settings);
- `speed/`: the timing harness and the figures it derives (x, its quartiles, the ideal);
- `model/`: model loading and the BatchNorm folding both engines run on;
- `recipe/`: the built-in recipes and their resolution, which decide the layers FP8 runs.
Left out on purpose: `study/`, `record/`, `report/` and the rest order the stages, store and show
the numbers, so a change there does not change a timing; the installed torch, Triton and the GPU
are checked apart (`rows.stale_reasons`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ENGINE_SOURCES = ("quant", "engines", "speed", "model", "recipe")
PACKAGE = Path(__file__).resolve().parent.parent
MARKER = "engine-sources.txt"  # in a study's folder: the hash of the code that ran it


def engine_sources_sha256(root: Path = PACKAGE) -> str:
    """SHA-256 over each covered file's path (relative to `root`) and bytes, in path order."""
    digest = hashlib.sha256()
    files = sorted(
        p
        for sub in ENGINE_SOURCES
        for p in (root / sub).rglob("*")
        if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    )
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def write_marker(folder: Path, sha: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(sha + "\n", encoding="utf-8")


def read_marker(folder: Path) -> str | None:
    """The hash a study in `folder` ran under; None where the zoo did not start it."""
    try:
        return (folder / MARKER).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
