"""cuBLASLt's FP8 products with their epilogues on the GPU (`quant/cublaslt/`): each epilogue
the backend uses against a float32 reference computed from the same FP8 operands, a launch
captured in a CUDA graph, and the custom op under torch.compile.

FP8 outputs: at least 99.9% of e4m3 codes equal to the reference's and never more than one
step apart (the reference rounds the float32 value once; cuBLASLt rounds its own float32 sum,
whose order differs, so a value within a float32 rounding of a code boundary may land on the
neighbour code). 16-bit outputs with float32 accumulation: within one fp16 ulp of the
reference plus 2^-23·K·T, T the row's and column's largest product: the two float32 sums add
the same K exact products in different orders, and with products of random sign the order's
error grows as a random walk, well inside that (not a worst-case bound).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantstudy.quant.cublaslt.library import unavailable

WHY = unavailable() if torch.cuda.is_available() else "no CUDA GPU"
pytestmark = pytest.mark.skipif(WHY is not None, reason=str(WHY))

E4M3 = torch.float8_e4m3fn
M, N, K = 197, 3072, 768  # ViT-B's fc1 at batch 1


def _ops(m: int = M, n: int = N, k: int = K) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    sx = (x.abs().amax() / 448).reshape(1).float()
    swc = (w.abs().amax(dim=1) / 448).float()
    return {
        "x8": (x / sx).to(E4M3),
        "sx": sx,
        "w8": (w / swc[:, None]).to(E4M3),
        "swc": swc,
        "bias": (torch.randn(n, device="cuda", generator=g) * 0.1).half(),
        "res": torch.randn(m, n, device="cuda", generator=g).half(),
    }


def _product(ops: dict[str, torch.Tensor]) -> torch.Tensor:
    torch.backends.cuda.matmul.allow_tf32 = False
    return (ops["x8"].float() @ ops["w8"].float().T) * (ops["sx"] * ops["swc"])


def _steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def ordinal(t: torch.Tensor) -> torch.Tensor:
        u = t.view(torch.uint8).int()
        return torch.where(u >= 0x80, -(u & 0x7F), u & 0x7F)

    return (ordinal(a) - ordinal(b)).abs()


def _call(
    ops: dict[str, torch.Tensor],
    epilogue: str,
    *,
    out_fp8: bool = False,
    d_scale: torch.Tensor | None = None,
    fast: bool = False,
) -> torch.Tensor:
    from quantstudy.quant.cublaslt.op import lt_linear

    alpha = ops["swc"] * ops["sx"]
    res = ops["res"] if epilogue == "bias+residual" else None
    return lt_linear(
        ops["x8"],
        ops["w8"],
        alpha,
        ops["sx"],
        ops["bias"],
        res,
        d_scale,
        epilogue,
        fast,
        out_fp8,
        True,
    )


def _near(got: torch.Tensor, want: torch.Tensor, ops: dict[str, torch.Tensor]) -> None:
    ulp16 = torch.finfo(torch.half).eps * want.abs().clamp_min(2**-14)
    terms = (ops["x8"].float().abs().amax(1, keepdim=True) * ops["sx"]) * (
        ops["w8"].float().abs().amax(1) * ops["swc"]
    )
    order = K * terms * 2**-23
    assert ((got.float() - want).abs() <= ulp16 + order).all()


def test_bias_in_fp16_is_the_reference_within_an_ulp() -> None:
    ops = _ops()
    _near(_call(ops, "bias"), _product(ops) + ops["bias"].float(), ops)


def test_bias_with_the_residual_as_c() -> None:
    ops = _ops(n=768)
    want = _product(ops) + ops["bias"].float() + ops["res"].float()
    # cuBLASLt adds C to the float32 sum and rounds once, as the reference does
    _near(_call(ops, "bias+residual"), want, ops)


def test_gelu_with_bias_to_fp8_is_the_tanh_form_within_one_step() -> None:
    ops = _ops()
    pre = _product(ops) + ops["bias"].float()
    d_scale = (448 / F.gelu(pre, approximate="tanh").abs().amax()).reshape(1).float()
    got = _call(ops, "gelu+bias", out_fp8=True, d_scale=d_scale)
    want = (F.gelu(pre, approximate="tanh") * d_scale).clamp(-448, 448).to(E4M3)
    steps = _steps(got, want)
    assert float((steps == 0).float().mean()) >= 0.999
    assert int(steps.max()) <= 1


def test_a_captured_launch_replays_the_eager_bits() -> None:
    ops = _ops()
    eager = _call(ops, "bias")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _call(ops, "bias")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_the_op_under_torch_compile_computes_the_eager_bits() -> None:
    ops = _ops()

    def f(x8: torch.Tensor) -> torch.Tensor:
        return _call({**ops, "x8": x8}, "bias", fast=True)

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(ops["x8"]), f(ops["x8"]))


def test_the_layer_s_gelu_epilogue_writes_its_cpu_tanh_reference_within_one_step() -> None:
    """`LtFP8Matmul` with GELU and an FP8 output on the GPU against the same layer off CUDA,
    which computes cuBLASLt's arithmetic in torch with the tanh form its record states (what
    its emulation computes too, `quant/layers/gelu.py`)."""
    from torch import nn

    from quantstudy.quant.layers.lt_matmul import LtFP8Matmul
    from quantstudy.quant.layers.spec import FP8LayerSpec

    torch.manual_seed(0)
    linear = nn.Linear(K, N)
    spec = FP8LayerSpec(x_scale=0.02, per_channel=True, dtype=torch.float16, act="gelu",
                        out_scale=0.01)  # fmt: skip
    layer = LtFP8Matmul(linear, spec)
    assert layer.gelu_form == "tanh"
    x = torch.randn(M, K)
    want = layer(x.half())
    got = layer.cuda()(x.half().cuda()).cpu()
    steps = _steps(got, want)
    assert float((steps == 0).float().mean()) >= 0.999
    assert int(steps.max()) <= 1
