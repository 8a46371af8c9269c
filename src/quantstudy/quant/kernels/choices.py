"""The autotuned kernels' stored choices: which config each launch took, kept on disk so that a
later process launches it without tuning (`tuning.tuned_launch`).

One JSON file beside Inductor's cache (`engines/builders.py` sets its directory), as the
per-layer kernel choice is: {"format": FORMAT, "choices": {key: {"config": index}}}. A key is
the kernel's search space (`space_id`: GPU, Triton version, the kernel's source and its config
list) and the launch as the autotuner keys it (`launch_key`); the entry is the chosen config's
index in that list, valid only under the same space. Beside the index an entry keeps what a
shipped table needs to hold the choice on another machine (`table.py`): the kernel's name and
source hash, the launch's key values and dtypes, the GPU, Triton and the config itself; an entry
without them (written before) still launches here. A file of another format, or a damaged one,
is a cold store: never misread, replaced by the next store.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

from quantstudy.env.machine import device_label, triton_version
from quantstudy.record.io import beside_inductor_cache, write_json_atomic

FORMAT = 2  # 1: the fused product's alone, keyed by its own launch fields (fp8_gemm_tuning.json)
FILE = "triton_tuning.json"

_MEMORY: list[dict[str, dict[str, Any]]] = []  # this process's copy, read once


class Tunable(Protocol):
    """What a stored choice is keyed on (`tuning.Tuned`, hashed by identity)."""

    def __hash__(self) -> int: ...

    @property
    def kernel(self) -> Any: ...
    @property
    def configs(self) -> list[Any]: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def arg_names(self) -> list[str]: ...


def store_path() -> Path:
    """Beside Inductor's cache, as the per-layer kernel choice is."""
    return beside_inductor_cache() / FILE


def forget() -> None:
    """Drop this process's copy: the next lookup reads the file again (what a new process sees)."""
    _MEMORY.clear()


def _source_id(kernel: Any) -> str:
    """Triton's hash of the kernel's source and what it calls; the interpreter's kernels have
    none, so their source."""
    key = getattr(kernel, "cache_key", None)
    return str(key) if key is not None else inspect.getsource(kernel.fn)


@functools.cache
def device_name(device: torch.device) -> str:
    """The GPU's name (what a shipped table is named for, `table.py`), else the device type."""
    return device_label(device)


@functools.cache
def space_id(tuned: Tunable, device: torch.device) -> str:
    """GPU, Triton, and the kernel's source and config list: a stored index means a config only
    under all four. Once per kernel and device: every launch's key holds it."""
    blob = f"{_source_id(tuned.kernel)}|{'|'.join(str(c) for c in tuned.configs)}".encode()
    where = device_name(device)
    return f"{where}|triton {triton_version()}|{hashlib.sha256(blob).hexdigest()[:16]}"


class Launch(NamedTuple):
    """A launch as the autotuner keys it: its key names' values, its arguments' dtypes, and
    the device it runs on."""

    values: dict[str, Any]
    dtypes: list[str]
    device: torch.device


def launch_of(tuned: Tunable, args: tuple[Any, ...], meta: dict[str, Any]) -> Launch:
    """The key names' values (from the arguments or the compile-time options), each argument's
    dtype, and the device."""
    named = dict(zip(tuned.arg_names, args, strict=False))
    values = {k: named[k] if k in named else meta.get(k) for k in tuned.keys}
    dtypes = [str(a.dtype) for a in args if hasattr(a, "dtype")]
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    return Launch(values, dtypes, device)


def launch_key(tuned: Tunable, args: tuple[Any, ...], meta: dict[str, Any]) -> str:
    """The launch as Triton's autotuner keys it in memory (`launch_of`), under `space_id`."""
    launch = launch_of(tuned, args, meta)
    values = list(launch.values.values())
    return json.dumps([space_id(tuned, launch.device), values, launch.dtypes])


def read_store(path: Path) -> dict[str, dict[str, Any]]:
    """The choices in `path`; none where it is absent, damaged or of another format."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    choices = data.get("choices")
    return choices if isinstance(choices, dict) else {}


def _memory() -> dict[str, dict[str, Any]]:
    if not _MEMORY:
        _MEMORY.append(read_store(store_path()))
    return _MEMORY[0]


def lookup(key: str, n_configs: int) -> int | None:
    """The stored config index for `key`, or None (never stored, or not an index of the list)."""
    entry = _memory().get(key)
    index = entry.get("config") if isinstance(entry, dict) else None
    return index if isinstance(index, int) and 0 <= index < n_configs else None


def store(key: str, index: int, about: dict[str, Any] | None = None) -> None:
    """Keep the choice in memory and on disk, merged with what other processes stored since;
    written atomically. Where the file cannot be written the next process tunes again. `about`
    is kept beside the index: what a shipped table is built from (`table.py: build_tables`)."""
    choices = _memory()
    choices[key] = {"config": index, **(about or {})}
    path = store_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**read_store(path), **choices}
        write_json_atomic(path, {"format": FORMAT, "choices": merged})
    except OSError:
        pass
