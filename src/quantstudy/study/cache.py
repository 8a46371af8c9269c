"""Cached tensors of finished study stages, so an interrupted study resumes where it stopped.

An entry is written atomically (`record/io.py`), so a crash leaves either the whole entry or
none. An entry that cannot be read back all the same (a truncated copy, a disk error, a file
replaced by hand) is not trusted: it is deleted, recomputed, and the console says so; the
study goes on and completes as if the entry had never been written.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from quantstudy.record.io import write_bytes_atomic

console = Console(stderr=True)

# What torch.load raises on a damaged file: a broken zip archive (RuntimeError from its reader,
# zipfile.BadZipFile), a cut-off pickle (EOFError, UnpicklingError), a disk error (OSError).
UNREADABLE = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError)


@dataclass(frozen=True)
class StageCache:
    """Tensors of finished stages, keyed by a hash of everything that decides them."""

    folder: Path
    key: str

    @classmethod
    def keyed(cls, folder: Path, parts: list[Any]) -> StageCache:
        """A cache whose key is the SHA-256 of `parts` as sorted JSON."""
        blob = json.dumps(parts, sort_keys=True).encode()
        return cls(folder, hashlib.sha256(blob).hexdigest())

    def refined(self, parts: list[Any]) -> StageCache:
        """The same folder under a key that also holds `parts`: for what a stage decides that
        the study's inputs do not (a "fastest" FP8 engine's layers kept in fp16, timed at
        build), so outputs computed under another decision are never read back."""
        return StageCache.keyed(self.folder, [self.key, parts])

    def path(self, name: str) -> Path:
        return self.folder / f"{name}-{self.key[:16]}.pt"

    def get_or_compute(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        path = self.path(name)
        if path.exists():
            value = _read(path)
            if value is not None:
                console.print(f"[dim]resumed {name} from {path}[/dim]")
                return value
        value = compute()
        buffer = io.BytesIO()
        torch.save(value, buffer)
        write_bytes_atomic(path, buffer.getvalue())
        return value

    def get_tensors(self, name: str) -> dict[str, torch.Tensor] | None:
        """The named entry of tensors (`put_tensors`), or None when absent or not trusted."""
        path = self.path(name)
        return _read(path, dict) if path.exists() else None

    def put_tensors(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Store a name -> tensor mapping as one entry, atomically."""
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        write_bytes_atomic(self.path(name), buffer.getvalue())


def _read(path: Path, kind: type = torch.Tensor) -> Any:
    """The cached tensor (or `kind` of tensors), or None (entry deleted, reason printed) when
    it cannot be trusted."""
    value, why = load_entry(path)
    if why is not None:
        _discard(path, why)
        return None
    tensors = value.values() if isinstance(value, dict) else [value]
    if not isinstance(value, kind) or not all(isinstance(t, torch.Tensor) for t in tensors):
        _discard(path, f"holds a {type(value).__name__}, not a {kind.__name__} of tensors")
        return None
    return value


def load_entry(path: Path) -> tuple[Any, str | None]:
    """A stored entry, loaded weights only: (its value, None), or (None, why it cannot be read)
    where the file is damaged (`UNREADABLE`)."""
    try:
        return torch.load(path, weights_only=True), None
    except UNREADABLE as e:
        reason = str(e).split("\n")[0][:120] or type(e).__name__
        return None, f"unreadable ({type(e).__name__}: {reason})"


def _discard(path: Path, why: str) -> None:
    console.print(f"[yellow]cache entry {path} is {why}; recomputing it[/yellow]", soft_wrap=True)
    path.unlink(missing_ok=True)
