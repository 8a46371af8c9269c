"""The FP8 kernels' own record of their launches: the tile the autotuner chose for each.

A study's engine autotunes each FP8 launch in its own process. A package cannot: it runs where
neither Triton's autotuner nor quantstudy is present, so every launch it holds carries one
fixed tile. The launchers (`gemm.fp8_gemm_triton`, `conv.fp8_conv2d_triton`,
`depthwise.depthwise_taps`) therefore note, within `recording()`, the tile the autotuner chose
for each launch, keyed by what the launch is: the kernel, its sizes, its compile-time options
and its tensors' dtypes (what the autotuner keys its choice on). Within `replaying(record)` the
same launchers look that key up instead of tuning, and launch the plain kernel with it through
`torch.library.wrap_triton` (`launchable`): that is how an op that AOTInductor traces into
(`torch.library.triton_op`, `quant/layers/opdef.py`) hands it the kernels to compile.

The key leaves out two things a traced launch does not have. Tensor data pointers: so which I/O
paths (pointers or tensor descriptors) a launch could take is not in it, and a replayed tile
always runs through pointers. Torch's non-Dynamo tracer (the one a `triton_op` goes through on
its way into AOTInductor) does not capture Triton's host-side `TensorDescriptor` arguments in
torch 2.11 or 2.14 (`TracingTritonHOPifier.call_HOP`: "TMA descriptor capturing not yet
supported in non-dynamo tracing"); the same tile through pointers computes the same bits, and
`Tile.tma` says which tiles the study ran on descriptors. And sizes that are symbolic under a
dynamic batch: they match any recorded size, and the largest recorded launch wins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

# One part of a key: a name and a value; an int size is None where it is symbolic (it then
# matches any recorded size).
Part = tuple[str, int | bool | str | None]
LaunchKey = tuple[str, tuple[Part, ...], tuple[Part, ...], tuple[str, ...]]


class ConfigLike(Protocol):
    """What a Triton `Config` tells about a tile (`triton` is imported lazily)."""

    kwargs: dict[str, Any]
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Tile:
    """The configuration one launch ran with: the kernel's BLOCK_* sizes with `num_warps` and
    `num_stages` (`blocks`), the streaming programs per SM of a thin product (0: one tile per
    program), and whether the autotuner had it read or write through tensor descriptors."""

    blocks: Mapping[str, int]
    stream: int = 0
    tma: bool = False

    @classmethod
    def of(cls, config: ConfigLike) -> Tile:
        """The tile of an autotuner's chosen config."""
        kw = config.kwargs
        blocks = {k: int(v) for k, v in kw.items() if k.startswith("BLOCK_")}
        blocks |= {"num_warps": int(config.num_warps), "num_stages": int(config.num_stages)}
        stream = int(kw.get("PER_SM", 0)) if kw.get("STREAM") else 0
        return cls(blocks, stream, bool(kw.get("TMA_LOADS") or kw.get("TMA_STORE")))

    @classmethod
    def given(
        cls, names: Sequence[str], tile: Sequence[int], stream: int = 0, tma: bool = False
    ) -> Tile:
        """A tile its caller fixed: the block sizes `names`, then warps and stages where `tile`
        gives them (Triton's defaults, 4 and 3, where it does not)."""
        blocks = dict(zip(names, tile, strict=False))
        launch = list(tile[len(names) :]) + [4, 3][len(tile) - len(names) :]
        return cls(blocks | {"num_warps": launch[0], "num_stages": launch[1]}, stream, tma)

    def sizes(self, *names: str) -> tuple[int, ...]:
        """The values of `names` (block sizes, then `num_warps`, `num_stages`), in order."""
        return tuple(self.blocks[n] for n in names)


def _part(name: str, value: object) -> Part:
    if isinstance(value, bool | str):
        return (name, value)
    if isinstance(value, int):
        return (name, int(value))
    if isinstance(value, torch.SymInt | torch.SymBool):
        return (name, None)
    raise TypeError(f"a launch key holds sizes and options, not {type(value).__name__}")


def launch_key(
    kernel: str,
    sizes: Mapping[str, object],
    options: Mapping[str, object],
    tensors: Iterable[torch.Tensor],
) -> LaunchKey:
    """The key of one launch: the kernel, its sizes (by name, in the launcher's order), its
    compile-time options (sorted by name) and the dtypes of the tensors it is handed."""
    return (
        kernel,
        tuple(_part(k, v) for k, v in sizes.items()),
        tuple(_part(k, options[k]) for k in sorted(options)),
        tuple(str(t.dtype) for t in tensors),
    )


def _matches(pattern: object, stored: object) -> bool:
    """Whether a traced key (None where a size is symbolic) matches a recorded one."""
    if pattern is None:
        return True
    if isinstance(pattern, tuple) and isinstance(stored, tuple):
        return len(pattern) == len(stored) and all(map(_matches, pattern, stored))
    return pattern == stored


def _total(key: LaunchKey) -> int:
    """The sum of a key's sizes: under a dynamic batch the largest recorded launch wins."""
    return sum(v for _, v in key[1] if isinstance(v, int) and not isinstance(v, bool))


@dataclass
class LaunchRecord:
    """Recorded tiles by launch key; `lookup` also serves keys with symbolic sizes."""

    tiles: dict[LaunchKey, Tile] = field(default_factory=dict)

    def add(self, key: LaunchKey, tile: Tile) -> None:
        self.tiles[key] = tile

    def lookup(self, key: LaunchKey) -> Tile:
        if key in self.tiles:
            return self.tiles[key]
        found = [k for k in self.tiles if _matches(key, k)]
        if not found:
            raise RuntimeError(
                f"no tile was recorded for the launch {key[0]} {dict(key[1])}: the traced "
                "engine launched what the recorded run did not (a bug)"
            )
        return self.tiles[max(found, key=_total)]

    @property
    def tma_replaced(self) -> int:
        """Recorded tiles the autotuner ran through tensor descriptors (replayed through
        pointers: module docstring)."""
        return sum(t.tma for t in self.tiles.values())

    def rows(self) -> list[dict[str, Any]]:
        """Every recorded tile with its launch's kernel and sizes, for a package's manifest."""
        return [
            {"launcher": key[0], "sizes": dict(key[1]), "blocks": dict(tile.blocks),
             "stream": tile.stream, "tma_replaced": tile.tma}
            for key, tile in self.tiles.items()
        ]  # fmt: skip


_RECORDING: list[LaunchRecord] = []
_REPLAYING: list[LaunchRecord] = []


@contextlib.contextmanager
def recording() -> Iterator[LaunchRecord]:
    """Within the block every FP8 launch notes the tile it ran with (the autotuner's choice,
    or the tile its caller fixed) into the yielded record."""
    record = LaunchRecord()
    _RECORDING.append(record)
    try:
        yield record
    finally:
        _RECORDING.remove(record)


def note(key: LaunchKey, tile: Tile) -> None:
    """A launcher's report of the tile a launch ran with."""
    for record in _RECORDING:
        record.add(key, tile)


@contextlib.contextmanager
def replaying(record: LaunchRecord) -> Iterator[None]:
    """Within the block the FP8 launchers take each launch's tile from `record` and launch
    through `torch.library.wrap_triton` (module docstring): for tracing into a package."""
    _REPLAYING.append(record)
    try:
        yield
    finally:
        _REPLAYING.pop()


def replayed(key: LaunchKey) -> Tile | None:
    """The recorded tile of this launch while replaying; None otherwise."""
    return _REPLAYING[-1].lookup(key) if _REPLAYING else None


def is_replaying() -> bool:
    return bool(_REPLAYING)


_POINTERS_ONLY: list[bool] = []


@contextlib.contextmanager
def pointers_only() -> Iterator[None]:
    """Within the block a launch that leaves its I/O paths to the autotuner is tuned among the
    pointer paths alone, as a fixed tile is. For a package (`package/build.py: choose_tiles`):
    its traced ops cannot take host-side tensor descriptors (module docstring), so each launch's
    tile is chosen for pointers rather than a descriptor tile replayed through them."""
    _POINTERS_ONLY.append(True)
    try:
        yield
    finally:
        _POINTERS_ONLY.pop()


def descriptors_allowed() -> bool:
    """Whether the autotuner may choose tensor descriptors here (`pointers_only`)."""
    return not _POINTERS_ONLY


def launchable(kernel: Any) -> Any:
    """`kernel` as a launcher should call it: through `torch.library.wrap_triton` while
    replaying (a traced op's kernels must be, so that AOTInductor finds and compiles them;
    inside a `triton_op` run eagerly torch hands the kernel back unwrapped), else itself."""
    if not _REPLAYING:
        return kernel
    from torch.library import wrap_triton

    return wrap_triton(kernel)
