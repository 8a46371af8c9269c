"""The fused product's persistent programs on a Hopper GPU: one wave of programs walking the
tiles through tensor descriptors writes the bits of one tile per program, with two of the
engine's epilogues (GELU; ReLU with a residual sum and its FP8 copy). Every epilogue, per-row
scales and an FP8 output included, runs under Triton's interpreter (tests/unit/test_persistent.py).
"""

import pytest
import torch

from quantstudy.quant.kernels.tiles import PERSISTENT_TILES

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="persistent programs load through tensor descriptors: Hopper or newer",
)


@pytest.mark.parametrize("tile", PERSISTENT_TILES, ids=lambda t: "x".join(map(str, t[:5])))
def test_persistent_programs_write_the_one_tile_bits(tile):
    """More tiles than SMs (several per program, ragged edges in M and N), GELU and a residual
    sum with an FP8 copy: the bits of the same tile launched one per program."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    g = torch.Generator().manual_seed(11)
    m, k, n = 20_000 + 37, 768, 2304 - 48
    cuda = torch.device("cuda")
    xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn).to(cuda)
    w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn).to(cuda)
    ws = (torch.rand(n, generator=g) / 50 + 1e-3).to(cuda)
    xs, bias = torch.tensor(0.05, device=cuda), torch.randn(n, generator=g).to(cuda)
    res = torch.randn(m, n, generator=g).half().to(cuda)
    out_scale = torch.tensor(0.5, device=cuda)
    *blocks, sub = tile
    fp8_copy = torch.empty(m, n, device=cuda).to(torch.float8_e4m3fn)
    epilogues = [
        {"act": "gelu"},
        {"act": "relu", "residual": res, "pair": fp8_copy, "out_scale": out_scale},
    ]
    for kw in epilogues:

        def run(kw: dict = kw, **extra: object) -> tuple[torch.Tensor, torch.Tensor | None]:
            y = fp8_gemm_triton(
                xq, w8, ws, xs, bias, out_dtype=torch.float16, tile=tuple(blocks),
                loads="tma", store="tma", round_to=torch.float16, **kw, **extra,
            )  # fmt: skip
            pair = kw.get("pair")
            return y.clone(), None if pair is None else pair.view(torch.uint8).clone()

        base, base_pair = run()
        got, got_pair = run(persistent=True, subtile=sub)
        assert torch.equal(got, base)
        assert base_pair is None or torch.equal(got_pair, base_pair)
