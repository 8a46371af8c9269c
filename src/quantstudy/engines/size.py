"""Artifact size: the bytes an engine's weights take, and optionally its compiled package.

`weight_bytes` counts what `torch.save` of the module would hold: each parameter and buffer
storage once (aliases and views count their whole storage once), tensor subclasses through their
inner tensors (`__tensor_flatten__`). `package_bytes` compiles an AOTInductor package (minutes:
the study asks for it only on CUDA, with `--package`) and returns its size on disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from quantstudy.quant.private_api import aoti_compile_and_package, is_wrapper_subclass


def _storages(t: torch.Tensor) -> Iterator[tuple[object, int]]:
    """(identity key, bytes) of each plain storage behind `t`."""
    if is_wrapper_subclass(t):
        inner_names, _ = t.__tensor_flatten__()
        for inner in inner_names:
            yield from _storages(getattr(t, inner))
        return
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    # Storages without an address (meta tensors, empty tensors) cannot be matched to each other;
    # each counts on its own (an empty one counts 0 bytes).
    key: object = (t.device.type, t.device.index, ptr) if ptr != 0 else ("unaddressed", id(t))
    yield key, storage.nbytes()


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of all parameter and buffer storages of `module`, each storage counted once."""
    seen: dict[object, int] = {}
    named = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for _, t in named:
        for key, nbytes in _storages(t):
            seen[key] = max(nbytes, seen.get(key, 0))
    return sum(seen.values())


def package_bytes(module: torch.nn.Module, example: torch.Tensor, package_path: Path) -> int:
    """Export `module` for `example`'s shape, package it with AOTInductor, return the file size.

    The package holds the compiled kernels and the weights (AOTInductor's default), for the static
    input shape of `example` (already prepared: device, dtype and memory format of the engine). A
    `torch.compile`d module is exported through its original module. Export or compilation errors
    propagate: a model that cannot be packaged has no package size.
    """
    original = getattr(module, "_orig_mod", module)
    package_path = Path(package_path)
    package_path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        exported = torch.export.export(original, (example,))
        written = aoti_compile_and_package(exported, package_path=str(package_path))
    return Path(written).stat().st_size
