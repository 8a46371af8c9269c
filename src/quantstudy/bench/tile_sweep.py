"""The fixed-tile launches `quantstudy bench products --sweep` times beside the autotuned ones:
every tile of `tiles.TILES` on every I/O path the product allows, and the streaming tiles
(`tiles.STREAM_TILES`) that hold the whole of a thin product's K and N."""

from __future__ import annotations

import torch

# (label, tile, loads, store, programs per SM) of one fixed-tile launch of the fused product
Launch = tuple[str, tuple[int, ...], str, str, int]


def sweep_launches(a8: torch.Tensor, w8: torch.Tensor) -> list[Launch]:
    """Every fixed-tile launch of the product `a8 @ w8.T`: descriptor loads where both operands
    allow them (`gemm.tma_ok`), a descriptor store where the fp16 output's rows are 16-byte
    aligned; labelled "<loads>/<store> BMxBNxBKxWxS" and "stream<per SM>/<store> ..."."""
    from quantstudy.quant.kernels.gemm import tma_ok
    from quantstudy.quant.kernels.tiles import STREAM_TILES, TILES

    n, k = w8.shape
    loads = ["pointer", "tma"] if tma_ok(a8) and tma_ok(w8) else ["pointer"]
    stores = ["pointer", "tma"] if n * 2 % 16 == 0 else ["pointer"]
    out: list[Launch] = []
    for load in loads:
        for store in stores:
            for cfg in TILES:
                out.append((f"{load}/{store} " + "x".join(map(str, cfg)), cfg, load, store, 0))
    for store in stores:
        for *tile, per_sm in STREAM_TILES:
            bn, bk = tile[1], tile[2]
            if n <= bn <= max(16, 2 * n) and k <= bk <= max(32, 2 * k):
                label = f"stream{per_sm}/{store} " + "x".join(map(str, tile))
                out.append((label, tuple(tile), "pointer", store, per_sm))
    return out
