"""The packaged FP8 product (`package/ops.py`) against the study's launch, one launch at a time.

Each case exports a module of one study FP8 op, points it at its packaged op
(`package/build.py: compile_package`), compiles it with AOTInductor, loads the package in a fresh
process (`python -I`, torch's libstdc++ preloaded as `quantstudy package` does) and compares
its output with the study's own launcher run with the same tile: the same kernel with the same
tile and arguments computes the same bits, so the comparison is exact. The cases are the kinds
of launch a real model's package has and the tiny study of test_package_gpu.py does not: the
padded product (a 1x1 conv writing the interior of the next conv's zero-padded buffer), a tile
the study ran on the tensor-descriptor (TMA) path and the package runs through pointers, and a
streaming tile (programs that loop over row tiles).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from quantstudy.package.build import compile_package
from quantstudy.package.loader import loader_env
from quantstudy.quant.kernels import launches
from quantstudy.quant.kernels.gemm import fp8_gemm_triton, tma_ok

E4M3 = torch.float8_e4m3fn
F16 = torch.float16


class FixedTile(launches.LaunchRecord):
    """A launch record that gives every launch one tile: the case's."""

    def __init__(self, tile: launches.Tile) -> None:
        super().__init__()
        self.tile = tile

    def lookup(self, key: launches.LaunchKey) -> launches.Tile:
        return self.tile


class OneProduct(nn.Module):
    """One study FP8 op on an FP8 input that arrives as its bytes (uint8), so the package
    and the reference read the same bits with no cast of their own in between."""

    def __init__(self, w8, w_scale, x_scale, bias, padded: tuple | None) -> None:
        super().__init__()
        for name, t in (("w8", w8), ("w_scale", w_scale), ("x_scale", x_scale), ("bias", bias)):
            self.register_buffer(name, t)
        self.padded = padded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = x.view(E4M3)
        args = (xq, self.w8, self.w_scale, self.x_scale, self.bias, "relu6", F16)
        if self.padded is None:
            return torch.ops.quantstudy.fp8_gemm(*args, None, F16)
        size, pads = self.padded
        return torch.ops.quantstudy.fp8_gemm_padded(*args, F16, None, list(size), list(pads))


def _operands(m: int, k: int, n: int):
    g = torch.Generator().manual_seed(m + k + n)
    xq = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(E4M3)
    w8 = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(E4M3)
    w_scale = torch.rand(n, generator=g) / 200 + 1e-3
    bias = torch.randn(n, generator=g) * 0.1  # the product term (about 1) dominates it
    return [t.cuda() for t in (xq, w8, w_scale, torch.tensor(0.02), bias)]


def _packaged(module: nn.Module, x: torch.Tensor, tile: launches.Tile, tmp: Path) -> torch.Tensor:
    """`module` packaged with `tile` for every launch (as `quantstudy package` compiles an
    engine), run on `x` in a fresh process."""
    path = tmp / "one.pt2"
    with launches.replaying(FixedTile(tile)):
        configs = {"always_keep_tensor_constants": True}  # build.inductor_configs, default mode
        retargeted = compile_package(module, x, None, path, configs)
    assert retargeted, "the study op was retargeted to its packaged op"
    torch.save(x.cpu(), tmp / "x.pt")
    script = (
        "import sys, torch; from torch._inductor import aoti_load_package; "
        "m = aoti_load_package(sys.argv[1]); x = torch.load(sys.argv[2]).cuda(); "
        "torch.save(m(x).cpu(), sys.argv[3])"
    )
    ran = subprocess.run(
        [sys.executable, "-I", "-c", script, str(path), str(tmp / "x.pt"), str(tmp / "y.pt")],
        capture_output=True, text=True, env=loader_env()[0], timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    return torch.load(tmp / "y.pt")


def _tile(block: tuple[int, int, int], stream: int = 0, tma: bool = False) -> launches.Tile:
    return launches.Tile.given(("BLOCK_M", "BLOCK_N", "BLOCK_K"), (*block, 4, 3), stream, tma)


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    differ = (got.float() != want.float()) & ~(got.isnan() & want.isnan())
    where = differ.nonzero()[:3].tolist()
    return f"{int(differ.sum())} of {got.numel()} outputs differ, first at {where}"


@pytest.mark.parametrize("pads", [(0, 1, 0, 1), (1, 2, 1, 2)])
def test_padded_product_package_writes_what_the_study_op_writes(tmp_path, pads):
    """Lite0's stride-2 depthwise convs read a buffer padded by the 1x1 conv before them,
    right and bottom by one pixel (3x3) or one pixel left and top and two right and bottom
    (5x5): the package (both kernels handed the whole buffer) must write the bytes the study's
    op writes, border zeros included. The second padding is the one whose scatter torch 2.11
    misplaced when the package wrote through a view from the interior's first element."""
    b, h, w, k, n = 2, 28, 28, 32, 96
    xq, w8, ws, xs, bias = _operands(b * h * w, k, n)
    block = (64, 32, 32)
    # the study's op as the study's engine runs it (autotuned, the interior view written)
    want = torch.ops.quantstudy.fp8_gemm_padded(
        xq, w8, ws, xs, bias, "relu6", F16, F16, None, [b, h, w], list(pads)
    )
    module = OneProduct(w8, ws, xs, bias, ((b, h, w), pads))
    got = _packaged(module, xq.view(torch.uint8), _tile(block), tmp_path)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want.cpu()), _first_difference(got, want.cpu())


def test_a_tma_tile_packaged_through_pointers_computes_the_same_bits(tmp_path):
    """The package runs a tile the study ran on the TMA path through pointers
    (`Tile.tma`): the same tile's products in the same order, so the same bits."""
    m, k, n = 2 * 28 * 28, 96, 144
    xq, w8, ws, xs, bias = _operands(m, k, n)
    assert tma_ok(xq) and tma_ok(w8), "these operands can take the descriptor path"
    block = (128, 64, 128)  # one of the autotuner's descriptor tiles (`quant/kernels/tiles.py`)
    want = fp8_gemm_triton(
        xq, w8, ws, xs, bias, "relu6", F16, tile=(*block, 4, 3), loads="tma", store="tma",
        round_to=F16,
    )  # fmt: skip
    module = OneProduct(w8, ws, xs, bias, None)
    got = _packaged(module, xq.view(torch.uint8), _tile(block, tma=True), tmp_path)
    assert torch.equal(got, want.cpu()), _first_difference(got, want.cpu())


@pytest.mark.parametrize("stream", [0, 2])
def test_a_pointer_tile_packaged_computes_the_same_bits(tmp_path, stream):
    """A thin product (N = 24, Lite0's projections) with one tile per program and as
    streaming programs (`stream` per SM, looping over row tiles; the tile holds all of K)."""
    m, k, n = 2 * 28 * 28, 96, 24
    xq, w8, ws, xs, bias = _operands(m, k, n)
    block = (64, 32, 128)
    want = fp8_gemm_triton(
        xq, w8, ws, xs, bias, "relu6", F16, tile=(*block, 4, 3), stream=stream, round_to=F16
    )
    module = OneProduct(w8, ws, xs, bias, None)
    got = _packaged(module, xq.view(torch.uint8), _tile(block, stream), tmp_path)
    assert torch.equal(got, want.cpu()), _first_difference(got, want.cpu())
