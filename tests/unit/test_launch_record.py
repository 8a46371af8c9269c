"""The FP8 launchers' record of their launches (`quant/kernels/launches.py`), under Triton's
interpreter: what a package is compiled with is the tile each launch recorded."""

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from torch.torch_version import TorchVersion


@pytest.mark.skipif(
    TorchVersion(torch.__version__) < (2, 14),
    reason="torch before 2.14 refuses an interpreted kernel in wrap_triton (replay goes through "
    "it); the GPU package tests cover replay there",
)
def test_a_replayed_launch_finds_the_tile_its_recorded_launch_ran_with():
    """Each launcher (product, kxk conv, depthwise conv) run once with a tile notes it; replayed
    without one (as a packaged op is traced) the same launch finds that very key, not a
    wildcard match: the options as vocabulary members (the eager engine) and as their text
    (an exported graph) give one key. The replayed launch, through `wrap_triton`, computes the
    recorded launch's bits."""
    require_triton()
    exact, same = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels import launches
        from quantstudy.quant.kernels.conv import fp8_conv2d_triton, tap_major
        from quantstudy.quant.kernels.depthwise import depthwise_taps
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        from quantstudy.record.vocab import Activation

        class Exact(launches.LaunchRecord):
            hits = 0
            def lookup(self, key):
                self.hits += key in self.tiles
                return super().lookup(key)

        g = torch.Generator().manual_seed(3)
        e4m3, f16 = torch.float8_e4m3fn, torch.float16
        def fp8(*shape):
            return (torch.randn(*shape, generator=g) * 3).to(e4m3)
        xq, w8 = fp8(40, 32), fp8(24, 32)
        ws, xs, bias = torch.rand(24, generator=g) / 7 + 0.01, torch.tensor(0.37), torch.randn(24)
        x4 = fp8(2, 16, 6, 6).contiguous(memory_format=torch.channels_last)
        w_taps = tap_major(fp8(24, 16, 3, 3))
        taps = fp8(9, 16)
        residual = torch.randn(40, 24, generator=g).half()
        def launch(act, tile):
            gemm = fp8_gemm_triton(xq, w8, ws, xs, bias, act, f16, tile, round_to=f16,
                                   residual=residual, res_act=act)
            conv = fp8_conv2d_triton(x4, w_taps, (3, 3), ws, xs, bias, act, f16, (1, 1),
                                     (1, 1), tile=tile and tile[:3], round_to=f16)
            dw = depthwise_taps(x4, taps, (3, 3), None, 2, (1, 1), (3, 3), act, xs, None, f16,
                                tile and (16, 32, 4), w_scale=ws[:16])
            return gemm, conv, dw
        record = Exact()
        with launches.recording() as noted:
            recorded = launch(Activation.RELU6, (32, 32, 32, 4, 3))
        record.tiles = noted.tiles
        with launches.replaying(record):
            replayed = launch("relu6", None)
        same = all(torch.equal(a, b) for a, b in zip(recorded, replayed))
        print(f"{record.hits}/{len(noted.tiles)}", int(same))
        """
    )
    assert exact == "3/3"
    assert same == "1"


def test_a_package_tunes_its_launches_for_pointers(monkeypatch):
    """`launches.pointers_only` (a package's `choose_tiles`): a launch that leaves its paths to
    the autotuner is offered the descriptor paths outside the block and the pointer paths
    alone inside it, where the packaged ops launch through pointers."""
    require_triton()
    import quantstudy.quant.kernels.gemm as gemm
    from quantstudy.quant.kernels import launches
    from quantstudy.quant.kernels.tiles import gemm_config

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # `tma_ok` allows descriptors off CUDA then
    offered = []

    def tuned(_kernel, _grid, args, _meta):
        offered.append(tuple(args[-2:]))  # tma_loads_ok, tma_store_ok
        return gemm_config(32, 32, 32, 4, 3)

    monkeypatch.setattr(gemm, "tuned_launch", tuned)
    xq = torch.randn(64, 32).to(torch.float8_e4m3fn)
    w8 = torch.randn(32, 32).to(torch.float8_e4m3fn)
    args = (xq, w8, torch.ones(32), torch.tensor(1.0), None, "none", torch.float16)
    gemm.fp8_gemm_triton(*args)
    with launches.pointers_only():
        gemm.fp8_gemm_triton(*args)
    gemm.fp8_gemm_triton(*args)
    assert offered == [(1, 1), (0, 0), (1, 1)]
