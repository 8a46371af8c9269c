"""The fused FP8 Triton kernel on CUDA (autotuned) against the same arithmetic in torch."""

import pytest
import torch

from quantstudy.quant.layers.fused_matmul import act_reference
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.record.build_spec import INTERVALS, PROMOTE
from quantstudy.record.vocab import Accumulation
from tests.fp8_steps import more_than_one_e4m3_step, within_one_e4m3_step

SHAPES = [(1, 16, 16), (49, 1152, 192), (6272, 24, 144), (200_704, 16, 96), (197, 384, 1536)]


# Every activation through pointers; the autotuner's own choice (descriptors allowed) once per
# shape: each autotuned launch compiles about 25 configs, most of this file's run time.
CASES = [("pointer", act) for act in ("none", "relu6", "gelu")] + [("autotuned", "gelu")]


def _integer_operands(m: int, k: int, n: int, seed: int, bias: bool = True):
    """FP8 operands whose products the GPU sums exactly, and products that dominate the bias.

    Entries are integers in [-3, 3] (exact in E4M3), so every product is an integer and every
    partial sum an integer below sum(|x| |w|) < 2^13 (asserted): exact in float32, and exact in
    the FP8 tensor cores' narrower accumulator too (it keeps about 14 significant bits on
    Hopper), whatever the summation order or promotion interval. Scales are powers of two, so
    scaling the sum is exact. The bias is a tenth of the products' spread: a product error of a
    few percent moves the output by many fp16 ulps instead of hiding under the bias."""
    g = torch.Generator().manual_seed(seed)
    xq = torch.randint(-3, 4, (m, k), generator=g).float().to(torch.float8_e4m3fn)
    w8 = torch.randint(-3, 4, (n, k), generator=g).float().to(torch.float8_e4m3fn)
    assert (xq.float().abs() @ w8.float().abs().t()).max() < 2**13
    w_scale = 2.0 ** -torch.randint(4, 8, (n,), generator=g).float()
    x_scale = torch.tensor(2.0**-4)
    product = (xq.float() @ w8.float().t()) * (w_scale * x_scale)  # exact (integers, powers of 2)
    b = torch.randn(n, generator=g) * 0.1 * product.std() if bias else None
    return xq, w8, w_scale, x_scale, b, product


def _fp16_ulp(v: torch.Tensor) -> torch.Tensor:
    """One fp16 unit in the last place at each value of `v` (2^-24 below the normal range)."""
    _, exponent = torch.frexp(v)  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
    return torch.exp2((exponent - 11).clamp_min(-24).float())


def _assert_rounds_like(out: torch.Tensor, ref: torch.Tensor, act: str) -> None:
    """The kernel's fp16 output is the float32 reference rounded once to fp16. The sums and the
    scaling are exact (`_integer_operands`), so piecewise-linear activations give the reference's
    float32 exactly and the outputs must be equal; GELU's erf (libdevice on the GPU, torch's on
    the CPU) may differ in the last float32 bits, which can move the fp16 rounding by one ulp."""
    want = ref.half().float()
    if act in ("none", "relu", "relu6"):
        assert torch.equal(out, want), (
            f"{(out != want).sum()} differ, worst {(out - want).abs().max()}"
        )
    else:
        worst = ((out - want).abs() / _fp16_ulp(want)).max().item()
        assert worst <= 1, f"{worst} fp16 ulps off"


@pytest.mark.parametrize("paths,act", CASES)
@pytest.mark.parametrize("m,k,n", [*SHAPES, (300, 40, 24)])
def test_fused_kernel_matches_torch(m, k, n, act, paths):
    """`paths` "pointer" keeps the autotuner off tensor descriptors; "autotuned" lets it pick."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    xq, w8, w_scale, x_scale, bias, product = _integer_operands(m, k, n, m + k + n)
    cuda = [t.cuda() for t in (xq, w8, w_scale, x_scale, bias)]
    io = {"loads": "pointer", "store": "pointer"} if paths == "pointer" else {}
    out = fp8_gemm_triton(*cuda, act, torch.float16, **io).float().cpu()
    _assert_rounds_like(out, act_reference(product + bias, act), act)


@pytest.mark.parametrize("k", [40, 728])
def test_fused_layer_with_unaligned_k_matches_its_cpu_reference(k):
    """K padded to 16 on the GPU path computes what the CPU reference computes unpadded."""
    from torch import nn

    from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul

    torch.manual_seed(k)
    conv = nn.Conv2d(k, 96, 1)
    x = torch.randn(4, k, 7, 7).half().float()  # both paths see the same fp16 input
    ref = FusedFP8Matmul(conv, FP8LayerSpec(0.02, True, torch.float32, "relu6"))
    gpu = FusedFP8Matmul(conv, FP8LayerSpec(0.02, True, torch.float16, "relu6")).cuda()
    with torch.no_grad():
        want = ref(x)
        x_cl = x.cuda().half().contiguous(memory_format=torch.channels_last)
        got = gpu(x_cl).float().cpu()
    assert gpu.k_pad == (-k) % 16
    # same FP8 operands; fp32 sums in another order and one fp16 rounding of the output
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-2), (got - want).abs().max()


@pytest.mark.parametrize("store", ["pointer", "tma"])
def test_streaming_programs_match_torch(store):
    """The streaming path, forced (the autotuner may or may not pick it for a shape)."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    m, k, n = 200_704, 16, 96
    xq, w8, w_scale, x_scale, _, product = _integer_operands(m, k, n, 7, bias=False)
    cuda = [t.cuda() for t in (xq, w8, w_scale, x_scale)]
    out = fp8_gemm_triton(*cuda, None, "relu6", torch.float16, (128, 128, 32), None, store, 4)
    _assert_rounds_like(out.float().cpu(), act_reference(product, "relu6"), "relu6")


@pytest.mark.parametrize("store", ["pointer", "tma"])
def test_fp8_output_is_the_next_layers_quantized_input(store):
    """Written FP8 equals `to_fp8` of the float32 result but where the two summation orders
    straddle a rounding boundary (one FP8 step, rare). Triton's interpreter converts fp32 to
    FP8 wrongly (ties and carries), so this is checked on the GPU only."""
    from quantstudy.quant.formats.fp8 import E4M3, to_fp8
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    m, k, n = 4096, 256, 512
    g = torch.Generator().manual_seed(3)
    xq = (torch.randn(m, k, generator=g) * 4).to(E4M3)
    w8 = (torch.randn(n, k, generator=g) * 4).to(E4M3)
    w_scale, x_scale = torch.rand(n, generator=g) / 100 + 1e-3, torch.tensor(0.05)
    bias, out_scale = torch.randn(n, generator=g), torch.tensor(0.01)
    cuda = [t.cuda() for t in (xq, w8, w_scale, x_scale, bias)]
    tile = (128, 128, 32, 8, 3)
    # promote every MMA: this checks the epilogue's FP8 write against float32 sums
    got = fp8_gemm_triton(
        *cuda, "gelu", E4M3, tile, None, store, out_scale=out_scale.cuda(), promote=32
    ).cpu()
    y = act_reference((xq.float() @ w8.float().t()) * (w_scale * x_scale) + bias, "gelu")
    want = to_fp8(y, out_scale)
    got, want = got.float(), want.float()
    assert (got != want).float().mean() < 1e-3
    # one step: the E4M3 spacing at the smaller of the two values (tests/fp8_steps.py)
    bad = ~within_one_e4m3_step(got, want)
    scaled = (y / out_scale)[bad][:8].tolist()
    assert not bad.any(), f"{more_than_one_e4m3_step(got, want)}, y / out_scale {scaled}"


def _fused_and_unfused(mode: Accumulation) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """One linear (K 256) as the unfused layer (torch._scaled_mm with the bias in its epilogue,
    fp16 out) and the fused one computes it, both summing as `mode` says; and the unfused
    layer's product dtype."""
    from torch import nn

    from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
    from quantstudy.quant.layers.matmul import FP8Matmul

    torch.manual_seed(0)
    lin = nn.Linear(256, 384)
    x = torch.randn(4096, 256).half().cuda()
    spec = FP8LayerSpec(0.02, True, torch.float16, promote=INTERVALS[mode])
    with torch.no_grad():
        unfused = FP8Matmul(lin, spec).cuda()
        unfused.use_device(x.device)
        fused = FusedFP8Matmul(lin, spec).cuda()
        return unfused(x).float(), fused(x).float(), unfused.mm_dtype


def test_fused_and_unfused_layers_promoting_agree_within_one_fp16_ulp():
    """Promoting every 128 products, the fused layer rounds where the unfused one does: the two
    differ only where the float32 sums, promoted out of the tensor cores at different points,
    fall on two sides of an fp16 rounding (one ulp), on at most 0.001 of the outputs. Not bit
    for bit: `test_promotion_interval_that_reproduces_scaled_mm` is that claim's strict xfail."""
    a, b, mm_dtype = _fused_and_unfused(Accumulation.PROMOTE128)
    same = (a == b).float().mean().item()
    worst = ((a - b).abs() / a.abs().clamp_min(2**-14)).max().item()
    print(f"torch._scaled_mm out {mm_dtype}: "
          f"{same:.4f} of outputs identical, worst relative difference {worst:.2e}")  # fmt: skip
    # the fp16 write is what this compares; a torch._scaled_mm without fp16 output is a failure
    # of the claim, not a case to skip
    assert mm_dtype == torch.float16, f"torch._scaled_mm writes {mm_dtype} here"
    assert same >= 0.999
    assert ((a - b).abs() <= _fp16_ulp(torch.maximum(a.abs(), b.abs()))).all()  # one fp16 ulp


def test_fused_and_unfused_layers_summing_fast_stay_within_the_accumulators_bound():
    """With all of K in the tensor cores (the default) each of the 256 additions may lose under
    2^-14 of the running sum of |terms| in each layer, in its own order: the two differ by less
    than 2 * 256 * 2^-14 of S = sum |x_q s| |w_q w_s| (bounded here by |x| max's share), plus one
    fp16 ulp. What share of outputs stays identical is printed: not asserted, not yet measured."""
    a, b, _ = _fused_and_unfused(Accumulation.FAST)
    same = (a == b).float().mean().item()
    print(f"summing fast: {same:.4f} of outputs identical, worst {(a - b).abs().max():.3e}")
    torch.manual_seed(0)  # the layer's weights and input again, for S
    w = torch.nn.Linear(256, 384).weight.detach()
    x = torch.randn(4096, 256)
    size = (x.abs() @ w.abs().t()).cuda() * 1.25  # FP8 rounds each factor by at most 1/16
    bound = 2 * 256 * 2.0**-14 * size + _fp16_ulp(torch.maximum(a.abs(), b.abs()))
    assert ((a - b).abs() <= bound).all(), ((a - b).abs() / bound).max().item()


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="measured on the H200 (tests/gpu/records/gpu-suite-7d58091.json): 1e-5 to 5e-5 of "
    "the outputs differ from torch._scaled_mm at K = 96, 256, 1024, so the bit-identical claim "
    "is withdrawn (docs/fp8-kernel.md); strict, so a fix that makes them identical fails here "
    "and is noticed",
)
@pytest.mark.parametrize("k", [96, 256, 1024])
def test_promotion_interval_that_reproduces_scaled_mm(k):
    """Which promotion interval (`mma.mma_step`) writes torch._scaled_mm's numbers (row-wise
    scales, fp16 out, bias in its epilogue, use_fast_accum=False): printed for every interval
    and tile depth, asserted for the default."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    g = torch.Generator().manual_seed(k)
    m, n = 4096, 384
    xq = (torch.randn(m, k, generator=g) * 16).to(torch.float8_e4m3fn).cuda()
    w8 = (torch.randn(n, k, generator=g) * 16).to(torch.float8_e4m3fn).cuda()
    w_scale = (torch.rand(n, generator=g) / 1000 + 1e-4).cuda()
    x_scale = torch.tensor(0.02).cuda()
    bias = torch.randn(n, generator=g).half().cuda()
    scale_a, scale_b = x_scale.expand(m, 1).contiguous(), w_scale[None, :].contiguous()
    want = torch._scaled_mm(
        xq, w8.t(), scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=torch.float16
    ).float()
    rows = {}
    for promote in (0, 32, 64, 128, 256):
        for bk in (32, 64, 128):
            if promote and bk > promote:
                continue
            got = fp8_gemm_triton(
                xq, w8, w_scale, x_scale, bias.float(), "none", torch.float16, (128, 128, bk, 8, 3),
                promote=promote, round_to=torch.float16,
            ).float()  # fmt: skip
            rows[(promote, bk)] = (got == want).float().mean().item()
    auto = fp8_gemm_triton(  # the engines' interval where they promote
        xq, w8, w_scale, x_scale, bias.float(), "none", torch.float16, round_to=torch.float16,
        promote=PROMOTE,
    ).float()  # fmt: skip
    same_auto = (auto == want).float().mean().item()
    print(f"\nK {k}: identical to torch._scaled_mm (promote, BLOCK_K): "
          + ", ".join(f"{p}/{bk} {v:.4f}" for (p, bk), v in rows.items())
          + f"; autotuned default ({PROMOTE}) {same_auto:.4f}")  # fmt: skip
    # the withdrawn claim (docs/fp8-kernel.md, "Accumulation"): the engines' promotion interval
    # makes the two compute bit-identical products
    assert same_auto == 1.0, f"{1 - same_auto:.5f} of outputs differ from torch._scaled_mm"
