"""The marker a zoo study's folder keeps of the hash of the engine sources it ran under
(`study/sources.py`): a zoo row measured under another hash is stale, so a run measures it
again (`zoo/row_files.py`).

The marker names how its hash was made (`HASHED_BY`, then the hash); a marker of another kind
(a bare hash: by bytes, before the hash of what the code computes) reads as no marker, so its
study runs again and its row is not stamped with a hash it was not made under.
"""

from __future__ import annotations

from pathlib import Path

from quantstudy.study.sources import HASHED_BY

MARKER = "engine-sources.txt"  # in a study's folder: the hash of the code that ran it


def write_marker(folder: Path, sha: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(f"{HASHED_BY} {sha}\n", encoding="utf-8")


def read_marker(folder: Path) -> str | None:
    """The hash a study in `folder` ran under; None where the zoo did not start it, or started
    it under another kind of hash."""
    try:
        words = (folder / MARKER).read_text(encoding="utf-8").split()
    except OSError:
        return None
    return words[1] if len(words) == 2 and words[0] == HASHED_BY else None
