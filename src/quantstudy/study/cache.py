"""Cached tensors of finished study stages, so an interrupted study resumes where it stopped."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

console = Console(stderr=True)


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

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}-{self.key[:16]}.pt"

    def get_or_compute(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        path = self._path(name)
        if path.exists():
            console.print(f"[dim]resumed {name} from {path}[/dim]")
            return torch.load(path, weights_only=True)
        value = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(value, tmp)
        tmp.replace(path)
        return value
