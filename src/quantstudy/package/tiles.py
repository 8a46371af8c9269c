"""The tiles the packaged FP8 kernels launch with, chosen at package time.

A study's engine autotunes each FP8 launch in its own process (`quant/triton_fp8.py`). A package
cannot: it runs where neither Triton's autotuner nor quantstudy is present, so every launch
must carry one fixed tile. `capture()` runs the study's FP8 engine once per batch on the GPU,
autotuning as the study does, and records the configuration each launch ran with, keyed by the
launch's arguments (shapes, dtypes, options). The packaged ops (`package/ops.py`) look the same
key up while AOTInductor traces them.

Where the autotuner chose the tensor-descriptor (TMA) path, the package takes the same tile
through pointers (the same bits). A packaged op's kernels are traced without Dynamo, and that
tracer does not capture Triton's host-side tensor descriptors (torch 2.11 and 2.14,
`TracingTritonHOPifier.call_HOP`: "TMA descriptor capturing not yet supported in non-dynamo
tracing"). `Tile.tma_replaced` says so, and the manifest counts those tiles (the check then
shows what that cost in speed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from quantstudy.record.errors import UserError

# The three launchers a study's FP8 engine calls, by (module, launcher, kernel) names, and the
# kernel keywords that make up a launch's tile.
LAUNCHERS = {
    "fp8_gemm": ("quantstudy.quant.kernels.gemm", "fp8_gemm_triton", "_fp8_gemm_kernel"),
    "fp8_conv2d": ("quantstudy.quant.kernels.conv", "fp8_conv2d_triton", "_fp8_conv2d_kernel"),
    "fp8_depthwise": ("quantstudy.quant.kernels.depthwise", "depthwise_taps", "_depthwise_kernel"),
}
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_P", "BLOCK_C", "num_warps", "num_stages")


@dataclass(frozen=True)
class Tile:
    """One launch's configuration: the kernel keywords of `TILE_KEYS` that it ran with, the
    streaming programs per SM (0: one tile per program) and whether the study's autotuner had
    picked the TMA path for it."""

    launcher: str
    blocks: dict[str, int]
    stream: int = 0
    tma_replaced: bool = False

    def launch_args(self) -> dict[str, Any]:
        """The launcher keywords that fix this tile (`tile=` and, for products, `stream=`)."""
        b = self.blocks
        if self.launcher == "fp8_depthwise":
            return {"tile": (b["BLOCK_P"], b["BLOCK_C"], b["num_warps"])}
        tile = (b["BLOCK_M"], b["BLOCK_N"], b["BLOCK_K"], b["num_warps"], b["num_stages"])
        return (
            {"tile": tile, "stream": self.stream} if self.launcher == "fp8_gemm" else {"tile": tile}
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _part(value: Any) -> Any:
    """A launch argument as it enters the key: a tensor by shape and dtype (a symbolic size,
    under a dynamic batch, as None: any size matches it), a string by its value, anything else
    as its text."""
    if isinstance(value, torch.Tensor):
        shape = tuple(int(s) if isinstance(s, int) else None for s in value.shape)
        return ("tensor", shape, str(value.dtype))
    if isinstance(value, (tuple, list)):
        return tuple(_part(v) for v in value)
    if isinstance(value, torch.SymInt):
        return None
    if isinstance(value, str):
        # a vocabulary member (`Activation.NONE`, a StrEnum) where the study's engine runs
        # eagerly and its plain text where the exported graph is traced: one key for both
        return repr(str(value))
    return repr(value)


def launch_key(launcher: str, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """The key of one launch: the launcher and every argument but the tile itself."""
    named = tuple(sorted((k, _part(v)) for k, v in kwargs.items() if k not in ("tile", "stream")))
    return (launcher, tuple(_part(a) for a in args), named)


def _matches(pattern: Any, stored: Any) -> bool:
    """Whether a traced key (None where a size is symbolic) matches a captured one."""
    if pattern is None:
        return True
    if isinstance(pattern, tuple) and isinstance(stored, tuple):
        return len(pattern) == len(stored) and all(map(_matches, pattern, stored))
    return pattern == stored


def _size(key: Any) -> int:
    """The sum of every size in a key: under a dynamic batch the largest captured batch wins."""
    if isinstance(key, tuple):
        return sum(_size(k) for k in key)
    return key if isinstance(key, int) else 0


class TileTable:
    """Captured tiles by launch key; `lookup` also serves traced keys with symbolic sizes."""

    def __init__(self) -> None:
        self.tiles: dict[tuple, Tile] = {}

    def add(self, key: tuple, tile: Tile) -> None:
        self.tiles[key] = tile

    def lookup(self, key: tuple) -> Tile:
        if key in self.tiles:
            return self.tiles[key]
        found = [k for k in self.tiles if _matches(key, k)]
        if not found:
            raise UserError(
                f"no tile was captured for the packaged launch {key[0]} {key[1][:2]}; the "
                "engine traced differently from the run that chose the tiles (a bug)"
            )
        return self.tiles[max(found, key=_size)]

    def records(self) -> list[dict[str, Any]]:
        """Every captured tile with its launch's tensor shapes, for the manifest."""
        rows = []
        for (launcher, args, _), tile in self.tiles.items():
            shapes = [list(a[1]) for a in args if isinstance(a, tuple) and a[:1] == ("tensor",)]
            rows.append({"launcher": launcher, "shapes": shapes[:2], **tile.to_json()})
        return rows


ACTIVE: list[TileTable] = []


@contextlib.contextmanager
def using(table: TileTable) -> Iterator[None]:
    """Within the block the packaged ops trace with `table`'s tiles."""
    ACTIVE.append(table)
    try:
        yield
    finally:
        ACTIVE.pop()


def active() -> TileTable:
    if not ACTIVE:
        raise RuntimeError("a packaged FP8 op ran on CUDA outside `tiles.using(...)`")
    return ACTIVE[-1]


def _tile_of(launcher: str, kw: dict[str, Any]) -> Tile:
    blocks = {k: int(kw[k]) for k in TILE_KEYS if k in kw and kw[k] is not None}
    blocks.setdefault("num_warps", 4)
    blocks.setdefault("num_stages", 3)
    stream = int(kw.get("PER_SM", 0)) if kw.get("STREAM") else 0
    tma = bool(kw.get("TMA_LOADS") or kw.get("TMA_STORE"))
    return Tile(launcher, blocks, stream, tma)


@contextlib.contextmanager
def capture() -> Iterator[TileTable]:
    """Within the block every FP8 launch of the study's engine is recorded with the tile it
    ran (autotuned, or the study's stored choice) into the yielded table."""
    import importlib

    table = TileTable()
    restore: list[tuple[object, str, object]] = []
    last: dict[str, dict[str, Any]] = {}
    try:
        for name, (module_name, launcher, kernel_name) in LAUNCHERS.items():
            module = importlib.import_module(module_name)
            kernel = getattr(module, kernel_name)
            original_run = kernel.run

            def run(*args, _name=name, _run=original_run, **kwargs):
                last[_name] = kwargs  # the autotuner's final launch is the chosen config
                return _run(*args, **kwargs)

            original = getattr(module, launcher)

            def launch(*args, _name=name, _launch=original, **kwargs):
                last.pop(_name, None)
                out = _launch(*args, **kwargs)
                if _name in last:
                    table.add(launch_key(_name, args, kwargs), _tile_of(_name, last[_name]))
                return out

            restore += [(kernel, "run", None), (module, launcher, original)]
            kernel.run = run
            setattr(module, launcher, launch)
        yield table
    finally:
        for owner, attr, value in reversed(restore):
            if value is None:
                del owner.__dict__[attr]  # the instance attribute set above
            else:
                setattr(owner, attr, value)
