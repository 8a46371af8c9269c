"""The FP8 product backends by name: `register`, `get`, `names`, `available`, `options`.

Every module of this folder but the infrastructure (`INFRASTRUCTURE`) and private ones is a
backend module exposing its `Backend` as `BACKEND`; the registry imports them on its first use,
not at import time, so adding a backend is one module (and its tests) and touches no other file.
A test or a plugin may also `register` a backend of its own. Names are kept in the order
`DEFAULT_BACKEND` first, then by name, which is the order of the command line's choices, the
record's timings and the report's columns.

Listing the names imports the backend modules, which import no torch at import time
(`base.py`): the command line builds its parser from them before torch loads.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from quantstudy.quant.backends.base import Availability, Backend
from quantstudy.record.build_spec import DEFAULT_BACKEND
from quantstudy.record.engines import FP16
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import FASTEST

# The modules of this folder that are no backend.
INFRASTRUCTURE = frozenset({"base", "ops", "registry"})
_REGISTERED: dict[str, Backend] = {}
_FOUND: list[bool] = []  # set once the folder's modules were imported


def register(backend: Backend) -> Backend:
    """Add `backend` under its name; a second backend of that name is a bug."""
    known = _REGISTERED.get(backend.name)
    if known is not None and known is not backend:
        raise ValueError(f"an FP8 backend named {backend.name!r} is registered already")
    if backend.name in (FASTEST, FP16):
        raise ValueError(f"{backend.name!r} names a choice, not a backend")
    _REGISTERED[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Remove the backend `name` (tests that register one of their own)."""
    _REGISTERED.pop(name, None)


def _discover() -> None:
    """Import every backend module of this folder once; each exposes `BACKEND`."""
    if _FOUND:
        return
    _FOUND.append(True)
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name in INFRASTRUCTURE or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        register(module.BACKEND)


def names() -> list[str]:
    """Every registered backend's name: the default first, then by name."""
    _discover()
    return sorted(_REGISTERED, key=lambda n: (n != DEFAULT_BACKEND, n))


def get(name: str) -> Backend:
    """The backend `name`; an unknown name is one line that lists the known ones."""
    _discover()
    if name not in _REGISTERED:
        raise UserError(f"no FP8 backend {name!r}; the backends are {', '.join(names())}")
    return _REGISTERED[name]


def available() -> dict[str, Availability]:
    """Every backend's availability on this machine, by name, in `names()` order."""
    return {name: get(name).availability() for name in names()}


def usable() -> list[str]:
    """The backends that run on this machine, in `names()` order."""
    return [name for name, (ok, _) in available().items() if ok]


def options() -> list[str]:
    """What `--fp8-kernel` takes: every backend's name, then "fastest" (a choice per layer)."""
    return [*names(), FASTEST]


def check_option(option: str) -> str:
    """`option` if `--fp8-kernel` takes it, else one line naming what it takes."""
    known = options()
    if option not in known:
        said = f"{', '.join(known[:-1])} or {known[-1]}"
        raise UserError(f"--fp8-kernel must be {said}, not {option}")
    return option
