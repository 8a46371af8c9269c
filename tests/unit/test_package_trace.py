"""The packaged FP8 ops as AOTInductor's tracer sees them, without a GPU: each op traced on fake
CUDA tensors with a recorded tile, the Triton launches it hands over read back from the graph.

This is the graph AOTInductor compiles; the GPU tests (`tests/gpu/test_package_ops_gpu.py`)
then run what it compiled. It reads torch internals (`aot_export_module`, the kernel side table
of `wrap_triton`), as a package build depends on them: a torch that changes them shows here.
"""

from __future__ import annotations

import pytest
import torch
from _interpreter import require_triton

from quantstudy.package import ops  # noqa: F401  (registers the packaged ops)
from quantstudy.quant.kernels import launches

E4M3, F16 = torch.float8_e4m3fn, torch.float16


class _Op(torch.nn.Module):
    def __init__(self, op, template: list) -> None:
        super().__init__()
        self.op, self.template = op, template

    def forward(self, *tensors: torch.Tensor) -> tuple:
        given = iter(tensors)
        out = self.op(*(next(given) if isinstance(a, torch.Tensor) else a for a in self.template))
        return out if isinstance(out, tuple) else (out,)


def _launches(op, make, tile: launches.Tile) -> list[dict]:
    """The Triton launches of `op` traced as AOTInductor traces it, every launch given `tile`."""
    from torch._functorch.aot_autograd import aot_export_module
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Fixed(launches.LaunchRecord):
        def lookup(self, key: launches.LaunchKey) -> launches.Tile:
            return tile

    with FakeTensorMode(allow_non_fake_inputs=True):
        template = make()
    tensors = [a for a in template if isinstance(a, torch.Tensor)]
    with launches.replaying(Fixed()):
        graph, _ = aot_export_module(_Op(op, template), tensors, trace_joint=False)
    found = []
    for node in graph.graph.nodes:
        if "triton_kernel_wrapper" in str(node.target):
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            args = node.kwargs["kwargs"]
            values = {k: v for k, v in args.items() if not isinstance(v, torch.fx.Node)}
            configs = getattr(kernel, "configs", [])
            found.append({
                "kernel": getattr(kernel, "fn", kernel).__name__,
                "grid": node.kwargs["grid"],
                "args": values,
                "buffers": {k: v.meta["val"].shape for k, v in args.items()
                            if isinstance(v, torch.fx.Node)},
                "warps": [(c.num_warps, c.num_stages) for c in configs],
            })  # fmt: skip
    return found


def _fake(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="cuda")


def test_packaged_padded_product_hands_both_kernels_the_whole_buffer():
    """`fp8_gemm_padded` traced into a package: the border kernel and the product take the
    dense padded buffer (no view of it: torch 2.11's AOTInductor mishandles a kernel's write
    through one, docs/package.md), the product with the interior's origin in it, on the
    recorded tile through pointers (a tile the study ran on descriptors included)."""
    require_triton()
    b, h, w, k, n, pads = 2, 6, 5, 32, 48, [1, 2, 1, 2]  # left, right, top, bottom

    def make() -> list:
        return [_fake(b * h * w, k, dtype=E4M3), _fake(n, k, dtype=E4M3), _fake(n), _fake(),
                _fake(n), "relu6", F16, F16, None, [b, h, w], pads]  # fmt: skip

    blocks = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4}
    border, product = _launches(
        torch.ops.quantstudy_pkg.fp8_gemm_padded, make, launches.Tile(blocks, 0, tma=True)
    )
    hp, wp = h + 1 + 2, w + 1 + 2
    assert border["kernel"] == "_zero_border_kernel"
    assert border["buffers"]["buf_ptr"] == (b, hp, wp, n)
    assert product["kernel"] == "_fp8_gemm_kernel"
    assert product["buffers"]["c_ptr"] == (b, hp, wp, n)
    assert product["args"]["out_origin"] == (1 * wp + 1) * n  # the interior's first pixel
    assert product["args"]["MAP_OUT"] and not product["args"]["TMA_LOADS"]
    assert not product["args"]["TMA_STORE"] and product["args"]["tma_loads_ok"] == 0
    picked = {key: product["args"][key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    assert picked == {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}
    assert product["warps"] == [(8, 4)]
    assert product["grid"] == [(-(-b * h * w // 64) * -(-n // 32), 1, 1)]


@pytest.mark.parametrize("op", ["fp8_conv2d", "fp8_depthwise"])
def test_packaged_convs_launch_the_recorded_tile(op):
    require_triton()
    x = lambda: _fake(2, 16, 6, 6, dtype=E4M3).contiguous(memory_format=torch.channels_last)  # noqa: E731
    if op == "fp8_conv2d":
        blocks = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2, "num_stages": 5}
        make = lambda: [x(), _fake(24, 144, dtype=E4M3), [3, 3], _fake(24), _fake(), None,  # noqa: E731
                        "relu", F16, [1, 1], [1, 1], [1, 1], None, F16]  # fmt: skip
        grid = (-(-72 // 32) * -(-24 // 16), 1, 1)
    else:
        blocks = {"BLOCK_P": 16, "BLOCK_C": 32, "num_warps": 2, "num_stages": 3}
        make = lambda: [x(), _fake(9, 16, dtype=E4M3), _fake(16), [3, 3], _fake(), None,  # noqa: E731
                        "relu6", E4M3, 2, [1, 1], [3, 3], _fake()]  # fmt: skip
        grid = (-(-18 // 16), 1, 1)
    (launch,) = _launches(getattr(torch.ops.quantstudy_pkg, op), make, launches.Tile(blocks))
    assert {key: launch["args"][key] for key in blocks if key.startswith("BLOCK")} == {
        key: v for key, v in blocks.items() if key.startswith("BLOCK")
    }
    assert launch["warps"][0][0] == 2
    assert launch["grid"] == [grid]
