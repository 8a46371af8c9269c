"""The tiles the product's prune keeps write the same bits, one of each way of walking K (its
depth, load path, persistent or not), summing fast (the default) and promoting every 128
products: a quality pass launches the first kept config untimed where a
timed pass tuned (`tuning.untimed_tiles`), so the study's quality is of the timed engine's
numbers only if the tile does not matter. Promoting, `mma_step` moves the sums to float32 at the
same K whatever the tile; summing fast, every tile feeds the tensor cores the same K steps in
the same order, which is what this checks on the hardware."""

import json

import pytest
import torch

from quantstudy.record.build_spec import INTERVALS
from quantstudy.record.vocab import Accumulation

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="the descriptor and persistent tiles need Hopper or newer",
)

E4M3 = torch.float8_e4m3fn


def _launch_args(config) -> dict:
    """`fp8_gemm_triton`'s arguments that fix one of the autotuner's configs."""
    kw = config.kwargs
    tile = (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], config.num_warps, config.num_stages)
    return {
        "tile": tile,
        "loads": "tma" if kw["TMA_LOADS"] else "pointer",
        "store": "tma" if kw["TMA_STORE"] else "pointer",
        "stream": kw["PER_SM"] if kw["STREAM"] else 0,
        "persistent": bool(kw["PERSISTENT"]),
        "subtile": bool(kw["SUBTILE"]),
    }


def _one_per_loop(configs: list) -> list:
    """One kept config per way of walking K and the tiles (BLOCK_K, the load path, persistent
    and subtiled or not): what could change the order of the tensor cores' sums. Compiling all
    42 would take minutes of the suite's GPU time."""
    seen: dict[tuple, object] = {}
    for c in configs:
        kw = c.kwargs
        seen.setdefault((kw["BLOCK_K"], kw["TMA_LOADS"], kw["PERSISTENT"], kw["SUBTILE"]), c)
    return list(seen.values())


# ViT-B's qkv at 8192 tokens: a grid deep enough for the persistent tiles
@pytest.mark.parametrize("mode", [Accumulation.FAST, Accumulation.PROMOTE128])
def test_every_way_of_walking_k_writes_the_same_bits(mode):
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM

    m, k, n = 8192, 768, 2304
    g = torch.Generator(device="cuda").manual_seed(m + n)
    xq = (torch.randn(m, k, device="cuda", generator=g) * 4).to(E4M3)
    w8 = (torch.randn(n, k, device="cuda", generator=g) * 4).to(E4M3)
    ws = torch.rand(n, device="cuda", generator=g) / 50 + 1e-3
    xs, bias = torch.tensor(0.05, device="cuda"), torch.randn(n, device="cuda", generator=g)
    promote = INTERVALS[mode]
    named = {"M": m, "N": n, "K": k, "PROMOTE": promote}
    kept = FP8_GEMM.prune(FP8_GEMM.configs, named | {"tma_loads_ok": 1, "tma_store_ok": 1})
    picked = _one_per_loop(kept)
    outs = {}
    for config in picked:
        args = _launch_args(config)
        outs[str(args)] = fp8_gemm_triton(
            xq, w8, ws, xs, bias, "gelu", torch.float16, round_to=torch.float16,
            promote=promote, **args,
        )  # fmt: skip
    # BLOCK_K 32 to 128, pointer and descriptor loads; summing fast, persistent tiles as well
    assert len(picked) >= (5 if mode == Accumulation.FAST else 3), [c.kwargs for c in picked]
    first, *rest = outs.items()
    differ = {name: int((y != first[1]).sum()) for name, y in rest if not torch.equal(y, first[1])}
    assert not differ, f"outputs differing from {first[0]}: {differ}"


@pytest.mark.parametrize("screen", ["1", "0"])
def test_a_cold_tune_screens_its_configs_and_launches_the_one_it_keeps(
    screen, tmp_path, monkeypatch
):
    """A product launch tuned cold (an empty store) on the hardware: with the screen (the
    default) every pruned config is timed from a short graph and three at full length; with
    `QUANTSTUDY_TUNE_SCREEN=0` every one at full length. Either way the tuned launch writes the
    bits of the kept config launched fixed, and the choice is stored."""
    from quantstudy.quant.kernels import choices, tuning
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("QUANTSTUDY_TUNE_SCREEN", screen)
    choices.forget()
    m, k, n = 197, 768, 768  # ViT-B's proj at batch 1
    g = torch.Generator(device="cuda").manual_seed(m + n)
    xq = (torch.randn(m, k, device="cuda", generator=g) * 4).to(E4M3)
    w8 = (torch.randn(n, k, device="cuda", generator=g) * 4).to(E4M3)
    ws = torch.rand(n, device="cuda", generator=g) / 50 + 1e-3
    xs, bias = torch.tensor(0.05, device="cuda"), torch.randn(n, device="cuda", generator=g)
    tuned = fp8_gemm_triton(xq, w8, ws, xs, bias, "none", torch.float16)
    row = tuning.TUNE_LOG[-1]
    assert row["kernel"] == "fp8_gemm" and row["configs"] > 3 and row["failed"] == 0
    if screen == "1":
        assert (row["screened"], row["finalists"]) == (row["configs"], 3)
    else:
        assert (row["screened"], row["finalists"]) == (0, row["configs"])
    best = next(c for c in FP8_GEMM.configs if str(c) == row["best"])
    fixed = fp8_gemm_triton(xq, w8, ws, xs, bias, "none", torch.float16, **_launch_args(best))
    assert torch.equal(tuned, fixed)
    assert len(json.loads(choices.store_path().read_text())["choices"]) == 1
    choices.forget()
