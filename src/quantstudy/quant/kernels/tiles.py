"""The fused FP8 product's tile tables, and how the autotuner prunes and ranks them (it times
them in `search.py`, with the kernel timer `gpu/timer.py`).

Which tiles the autotuner may try per I/O path, and which of those fit a given product, are
decisions about search cost as much as speed; keeping them apart from the kernel keeps the
kernel's arithmetic readable and lets the convolution kernels share the bound on how many tiles
a launch tries (`bounded`). Why each table holds what it does is in
docs/fp8-kernel.md.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import triton

from quantstudy.env.switches import GEMM_CONFIGS
from quantstudy.record.build_spec import PROMOTE
from quantstudy.record.errors import UserError

# A Triton `triton.Config` (triton is not read by the type checker: its objects are Any there).
Config = Any

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). The first nine won or tied on at least one of
# EfficientNet-Lite0's products in a sweep of tiles and load paths (docs/fp8-kernel.md); the
# last three keep the batch-1 rows and the wide linears of vision transformers covered.
TILES = [
    (256, 128, 64, 8, 3),
    (256, 32, 64, 8, 4),
    (256, 64, 32, 8, 3),
    (128, 64, 32, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 128, 4, 4),
    (128, 128, 64, 8, 3),
    (64, 128, 128, 4, 3),
    (64, 64, 128, 4, 4),
    (64, 32, 64, 4, 4),
    (32, 64, 128, 4, 3),
    (128, 256, 64, 8, 3),
]

# Tiles tried per I/O path (TMA loads, TMA store): every tile with pointers; with descriptors
# the tiles that won with them in that sweep (loads) and the store-bound winners (store), so
# that autotuning stays at about 35 configs per product.
_STORE_BOUND = [(256, 64, 32, 8, 3), (128, 64, 32, 4, 4), (256, 32, 64, 8, 4)]
_TMA_LOADS = [(256, 128, 64, 8, 3), (128, 64, 128, 4, 4), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3)]
# Deeper K steps for the wider linears of vision transformers, the large-K products where the
# tiles above trail cuBLASLt (docs/fp8-kernel.md, "Launch"); not benched alone. A tile whose
# shared memory does not fit is skipped by the autotuner.
_WIDE = [(128, 128, 128, 8, 4), (128, 256, 128, 8, 3)]
PATH_TILES = {
    (False, False): TILES,
    (False, True): [*_STORE_BOUND, (256, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3)],
    (True, False): [*_TMA_LOADS, *_WIDE],
    (True, True): [*_TMA_LOADS, *_WIDE, (128, 64, 64, 4, 4), (128, 128, 64, 8, 3)],
}

# Streaming programs for thin products (K <= 64, N <= 256): (BLOCK_M, BLOCK_N, BLOCK_K, warps,
# stages, programs per SM). With one tile per program the thin-K expansion convs, which only
# write their output, fell well short of the fp16 conv's write bandwidth (docs/fp8-kernel.md);
# these tiles are offered to the autotuner beside the others, not measured alone.
STREAM_TILES = [
    (128, bn, bk, 4 if bn <= 64 else 8, 3, per_sm)
    for bn in (16, 32, 64, 128, 256)
    for bk in (32, 64)
    for per_sm in (2, 4)
]

# Persistent programs (`_persistent` in `kernels/gemm_kernel.py`), loads through descriptors:
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, subtiled epilogue). BLOCK_K 128 is one promotion
# (`PROMOTE`), so the tensor cores sum a whole K tile before float32 takes over, as cuBLASLt does.
# 128x128 fills the last wave of 132 SMs better where N is 768; 128x256 and 256x128 halve the
# loads per product where the grid is many waves deep.
PERSISTENT_TILES = [
    (128, 128, 128, 8, 4, False),
    (128, 256, 128, 8, 3, True),
    (256, 128, 128, 8, 3, True),
    (128, 128, 128, 4, 4, False),
    (64, 128, 128, 4, 4, False),
]

# How the kernel reads its operands and writes its output: through pointers (any layout), or
# through tensor descriptors (Hopper's copy engine; needs 16-byte aligned rows, see `tma_ok`).
IO_PATHS = ("pointer", "tma")


def prune_gemm(configs: list[Config], named_args: dict[str, Any], **kwargs: Any) -> list[Config]:
    """Drop tiles far wider than the problem (they only waste the autotuner's time), streaming
    tiles that do not hold the whole of K and N, and the descriptor paths this launch cannot
    take.

    A tile may overhang a dimension up to 64 (K 16-32 products ran fastest with BLOCK_K 64 in the
    tile sweep); a bound of 32 leaves no tile for N 16 / K 32 (Lite0's first layer), whose
    fallback, a 256x128 tile, is far slower (docs/fp8-kernel.md)."""
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    has = {"TMA_LOADS": named_args["tma_loads_ok"], "TMA_STORE": named_args["tma_store_ok"]}
    promote = {**named_args, **kwargs}.get("PROMOTE", PROMOTE)  # where Triton puts constexprs

    def programs(c: Config) -> int:
        return int(triton.cdiv(m, c.kwargs["BLOCK_M"]) * triton.cdiv(n, c.kwargs["BLOCK_N"]))

    usable = [
        c
        for c in configs
        if all(has[flag] or not c.kwargs[flag] for flag in has)
        and not (promote and c.kwargs["BLOCK_K"] > promote)
        and (not c.kwargs["PERSISTENT"] or persistent_pays(promote, k, programs(c)))
    ]

    def fits(c: Config) -> bool:
        bm, bn, bk = (c.kwargs[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        if c.kwargs["STREAM"]:
            return bool(
                n <= bn <= max(16, triton.next_power_of_2(n))
                and k <= bk <= max(32, triton.next_power_of_2(k))
                and m >= 4 * bm
            )
        return bool(
            bn <= max(64, triton.next_power_of_2(n))
            and bk <= max(64, triton.next_power_of_2(k))
            and bm <= max(64, triton.next_power_of_2(m))
        )

    keep = [c for c in usable if fits(c)]
    if not keep:
        tiles = [c for c in usable if not c.kwargs["STREAM"]]
        return [min(tiles, key=block_volume)]
    limit = gemm_config_limit()
    return keep if limit is None else ranked(keep, named_args)[:limit]


def ranked(configs: list[Config], named_args: dict[str, Any]) -> list[Config]:
    """A product launch's pruned configs in the order a bound keeps them (`bounded`); a
    `QUANTSTUDY_GEMM_CONFIGS` bound takes the first of them (`quantstudy bench bound-check`
    reads where each winner ranks)."""
    m, n, k = named_args["M"], named_args["N"], named_args["K"]
    sizes = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}
    grid = ("BLOCK_M", "BLOCK_N")
    return bounded(configs, sizes, dict.fromkeys(sizes, 64), grid, len(configs))


def persistent_pays(promote: int, k: int, programs: int) -> bool:
    """Whether a persistent tile is worth timing for a launch: only with all of K in the tensor
    cores (`promote` 0, the launch's PROMOTE), K beyond one promotion, and a grid of the tile's
    `programs` at least two waves deep (`fill_programs`). Elsewhere they do not win: promoting,
    they are level with the one-tile kernel at best, on thin K they lose, and a shallow grid
    leaves them nothing to overlap; leaving them out there spares a cold tune their configs
    (why: docs/fp8-kernel.md, "The products against cuBLASLt", persistent programs)."""
    return promote == 0 and k > PROMOTE and programs >= 2 * fill_programs()


def gemm_config_limit() -> int | None:
    """At most this many of the product's pruned configs per launch, ranked by `bounded`, where
    `$QUANTSTUDY_GEMM_CONFIGS` says so; None (the default): every one. A lab setting, not a
    default: the winners on deep grids rank lower, so a bound costs the products that matter
    most (why: docs/fp8-kernel.md, "What a cold tune costs", "Measured, and not taken")."""
    value = os.environ.get(GEMM_CONFIGS)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{GEMM_CONFIGS}={value!r}: give a whole number of configs, 1 or more")
    return int(value)


# Tiles a kxk or depthwise conv launch may try (`bounded`). A cold tune compiles every config it
# tries (in parallel where Triton can, `tuning._precompile`) and times each from a CUDA graph, and
# a study tunes each distinct layer shape at each timed batch: four keeps a parallel compile to
# about one config's time on a machine with four or more cores, and each layer still gets the
# tiles its shape ranks best. Its cost on the GPU is an open question (docs/fp8-kernel.md, "What a
# cold tune costs").
CONV_CONFIGS = 4

# A grid of fewer programs than the GPU has streaming multiprocessors leaves some idle, so
# `bounded` ranks the tiles that give more programs first, up to that many (`fill_programs`);
# off CUDA (Triton's interpreter) an H100 SXM's or H200's count.
CPU_FILL_PROGRAMS = 132


@functools.cache
def _sm_count(device: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def fill_programs() -> int:
    """The current CUDA device's streaming multiprocessors, else `CPU_FILL_PROGRAMS`."""
    import torch

    if not torch.cuda.is_available():
        return CPU_FILL_PROGRAMS
    return _sm_count(torch.cuda.current_device())


def bounded(
    configs: list[Config],
    sizes: dict[str, int],
    floors: dict[str, int],
    grid: Sequence[str],
    limit: int = CONV_CONFIGS,
) -> list[Config]:
    """At most `limit` of `configs`, best ranked first (the untimed launch takes the first).

    A tile fits when each block (`sizes`: block name -> the dimension it tiles) is no wider than
    the dimension's power of two, or than its floor. Fitting tiles rank by, in turn: programs in
    the grid (the blocks named in `grid`), counted up to `fill_programs()`, more first (a batch-1
    layer wants small tiles that fill the GPU); the share of the tile's work that is real rather
    than padding past a dimension's end, to a tenth (a few percent of padding does not outrank
    the table), more first; the product's descriptor paths, loads then store, first (most tuned
    winners take them: docs/fp8-kernel.md, "What a cold tune costs"); the table's order (its
    best tiles first). Where none fits, the smallest tile alone."""

    def fits(c: Config) -> bool:
        return all(
            c.kwargs[b] <= max(floors.get(b, 1), triton.next_power_of_2(n))
            for b, n in sizes.items()
        )

    fill = fill_programs()

    def rank(i: int) -> tuple[int | float, ...]:
        kw = configs[i].kwargs
        programs = math.prod(triton.cdiv(sizes[b], kw[b]) for b in grid)
        real = math.prod(n / (triton.cdiv(n, kw[b]) * kw[b]) for b, n in sizes.items())
        paths = (-kw.get("TMA_LOADS", 0), -kw.get("TMA_STORE", 0))  # the convs have none
        return (-min(programs, fill), -round(real, 1), *paths, i)

    keep = sorted((i for i, c in enumerate(configs) if fits(c)), key=rank)
    if not keep:
        return [min(configs, key=block_volume)]
    return [configs[i] for i in keep[:limit]]


def config_words(c: Config) -> str:
    """A config as a record names it: "BMxBNxBK w<warps> s<stages>" and its paths and loop
    ("tma-loads", "tma-store", "stream<programs per SM>", "persistent", "sub")."""
    kw = c.kwargs
    blocks = "x".join(str(kw[k]) for k in kw if k.startswith("BLOCK_"))
    words = [blocks, f"w{c.num_warps}", f"s{c.num_stages}"]
    words += [
        w for flag, w in (("TMA_LOADS", "tma-loads"), ("TMA_STORE", "tma-store")) if kw.get(flag)
    ]
    words += [f"stream{kw['PER_SM']}"] if kw.get("STREAM") else []
    words += [w for flag, w in (("PERSISTENT", "persistent"), ("SUBTILE", "sub")) if kw.get(flag)]
    return " ".join(words)


def block_volume(c: Config) -> int:
    """The product of a tile's block sizes: the smallest tile is the fallback where none fits."""
    return math.prod(int(v) for k, v in c.kwargs.items() if k.startswith("BLOCK_"))


def set_block_shapes(nargs: dict[str, Any]) -> None:
    """Give the descriptors the tile of the config about to run (a descriptor carries it)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    cn = bn // 2 if nargs.get("SUBTILE") else bn  # a subtiled epilogue stores half a tile
    for name, shape in (("a_desc", [bm, bk]), ("b_desc", [bn, bk]), ("c_desc", [bm, cn])):
        if nargs[name] is not None:
            nargs[name].block_shape = shape


def gemm_config(
    bm: int,
    bn: int,
    bk: int,
    warps: int,
    stages: int,
    loads: bool = False,
    store: bool = False,
    per_sm: int = 0,
    persistent: bool = False,
    subtile: bool = False,
) -> Config:
    meta: dict[str, int | bool] = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    meta |= {"TMA_LOADS": loads, "TMA_STORE": store}
    meta |= {"STREAM": per_sm > 0, "PER_SM": per_sm}
    meta |= {"PERSISTENT": persistent, "SUBTILE": subtile}
    return triton.Config(meta, num_warps=warps, num_stages=stages, pre_hook=set_block_shapes)
