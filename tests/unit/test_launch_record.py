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
