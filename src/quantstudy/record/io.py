"""Atomic file writes, so an interrupted study never leaves a half-written record."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """UTF-8 text twin of `write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON with sorted keys and a trailing newline, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
