"""The hash of the code that makes a measurement's numbers, so a measurement can say "same code"
without naming a commit: a zoo row measured under another hash is stale (`zoo/rows.py`), and
a peers row joins a record of rows measured under its hash (`bench/peers/rows.py`).

What `ENGINE_SOURCES` covers, by path under `quantstudy/`, every `.py` and `.yaml` file inside:
- `quant/`: the FP8 kernels, their tile tables and tuning, the FP8 layers, the plan and rewrites;
- `engines/`: how the fp16 and FP8 engines are assembled and compiled (Inductor settings);
- `speed/`: the timing harness and the figures it derives (x, its quartiles, the ideal);
- `model/`: model loading and the BatchNorm folding both engines run on;
- `recipe/`: the built-in recipes and their resolution, which decide the layers FP8 runs.
Left out on purpose: the rest of `study/`, `record/`, `report/` and the others order the stages,
store and show the numbers, so a change there does not change a timing; the installed torch,
Triton and the GPU are checked apart (the zoo's `rows.stale_reasons`, the peers' `check_alike`).
A caller whose numbers come from more code names it (`engine_sources_sha256(covered=...)`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

ENGINE_SOURCES = ("quant", "engines", "speed", "model", "recipe")
PACKAGE = Path(__file__).resolve().parent.parent


def engine_sources_sha256(root: Path = PACKAGE, covered: Sequence[str] = ENGINE_SOURCES) -> str:
    """SHA-256 over each covered file's path (relative to `root`) and bytes, in path order;
    `covered`: folders (every `.py` and `.yaml` file inside) and files, relative to `root`."""
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
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()
