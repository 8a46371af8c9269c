"""The marker a zoo study's folder keeps of the hash of the engine sources it ran under
(`study/sources.py`): a zoo row measured under another hash is stale, so a run measures it
again (`zoo/rows.py`).
"""

from __future__ import annotations

from pathlib import Path

MARKER = "engine-sources.txt"  # in a study's folder: the hash of the code that ran it


def write_marker(folder: Path, sha: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(sha + "\n", encoding="utf-8")


def read_marker(folder: Path) -> str | None:
    """The hash a study in `folder` ran under; None where the zoo did not start it."""
    try:
        return (folder / MARKER).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
