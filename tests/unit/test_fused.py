"""The fused FP8 layer on CPU: its Triton kernel (interpreted), activation absorption, engine."""

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul, activation_name
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.rewrites.absorb import absorbable_activations
from quantstudy.record.build_spec import BuildSpec

CPU = torch.device("cpu")


def test_triton_kernel_under_the_interpreter_matches_torch():
    """Every I/O path (pointers; tensor descriptors for the loads where K's rows are 16-byte
    aligned, for the store where N's are), with edges in M, N and K that do not fill a tile."""
    require_triton()
    pointer, tma, refused, worst = run_interpreted(
        """
        import torch
        from quantstudy.quant.layers.fused_matmul import act_reference
        import itertools
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(0)
        # which (loads, store) paths each (K, N) allows: 16-byte rows of FP8 K, fp16 N
        ok = {  # (tma loads allowed, tma store allowed)
            (24, 40): (False, True), (16, 16): (True, True), (100, 33): (False, False),
            (48, 40): (True, True),
        }
        worst, runs = 0.0, {"pointer": 0, "tma": 0, "refused": 0}
        for m, k, n in [(70, 24, 40), (5, 16, 16), (130, 100, 33), (70, 48, 40)]:
            for act in ["none", "relu", "relu6", "silu", "hardswish", "gelu"]:
                xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
                w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
                ws, xs = torch.rand(n, generator=g) + 0.5, torch.tensor(0.7)
                b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
                ref = act_reference((xq.float() @ w8.float().t()) * (ws * xs) + b, act)
                for loads, store in itertools.product(["pointer", "tma"], repeat=2):
                    can_load, can_store = ok[(k, n)]
                    if (loads == "tma" and not can_load) or (store == "tma" and not can_store):
                        try:  # refused with a clear message, never run misaligned
                            fp8_gemm_triton(
                                xq, w8, ws, xs, b, act, torch.float16, (32, 32, 32), loads, store
                            )
                        except ValueError:
                            runs["refused"] += 1
                        continue
                    y = fp8_gemm_triton(
                        xq, w8, ws, xs, b, act, torch.float16, (32, 32, 32), loads, store
                    )
                    err = ((y.float() - ref).abs() / (ref.abs() + 1)).max().item()
                    worst = max(worst, err)
                    runs[loads] += 1
                    runs[store] += 1
        print(runs["pointer"], runs["tma"], runs["refused"], worst)
        """
    )
    # per activation, sides read or written by each path: (70, 24, 40) runs 2 paths (pointer 3
    # sides, tma 1), (5, 16, 16) and (70, 48, 40) 4 each (4 and 4), (130, 100, 33) 1 (2 and 0);
    # the 2 + 3 misaligned combinations are refused
    assert (int(pointer), int(tma), int(refused)) == (6 * 13, 6 * 9, 6 * 5)
    assert float(worst) < 1e-3  # one fp16 rounding (2^-11 relative) and fp32 summation order


def test_every_promotion_interval_counts_each_k_step_once_under_the_interpreter():
    """The tensor-core and float32 accumulators (`mma_step`) hand over at every PROMOTE products:
    across K steps (BLOCK_K < PROMOTE), within one (BLOCK_K == PROMOTE), or never (0). The
    interpreter sums in float32 either way, so each must give the plain product; a K step lost
    or added at a hand-over would not. A tile deeper than PROMOTE is refused."""
    require_triton()
    (worst, refused) = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(1)
        m, k, n = 40, 304, 24  # 10 K steps of 32, the last one half empty
        xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(n, generator=g) / 100 + 1e-3, torch.tensor(0.05)
        ref = (xq.float() @ w8.float().t()) * (ws * xs)
        worst = 0.0
        for bk, promote in [(32, 0), (32, 32), (32, 64), (32, 128), (64, 64), (64, 256)]:
            for loads in ["pointer", "tma"]:
                y = fp8_gemm_triton(
                    xq, w8, ws, xs, None, "none", torch.float32, (32, 32, bk), loads,
                    promote=promote,
                )
                worst = max(worst, ((y - ref).abs() / (ref.abs() + 1)).max().item())
        try:
            fp8_gemm_triton(xq, w8, ws, xs, None, "none", torch.float32, (32, 32, 64), promote=32)
            refused = 0
        except ValueError:
            refused = 1
        print(worst, refused)
        """
    )
    assert float(worst) < 1e-5 and int(refused) == 1


@pytest.mark.parametrize("promote", [-128, 96])
def test_promotion_interval_must_be_zero_or_a_power_of_two(promote):
    require_triton()
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    xq = torch.zeros(4, 256).to(torch.float8_e4m3fn)
    w8 = torch.zeros(8, 256).to(torch.float8_e4m3fn)
    args = (xq, w8, torch.ones(8), torch.tensor(1.0), None, "none", torch.float16)
    with pytest.raises(ValueError, match="power of two"):
        fp8_gemm_triton(*args, promote=promote)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"residual": torch.zeros(4, 4)}, r"residual must be \(4, 8\)"),
        ({"pair": torch.zeros(4, 8).to(torch.float8_e4m3fn)}, "needs out_scale"),
        ({"pair": torch.zeros(8, 4).to(torch.float8_e4m3fn), "out_scale": torch.tensor(1.0)},
         r"contiguous \(4, 8\)"),
        ({"pair": torch.zeros(4, 8).to(torch.float8_e4m3fn), "out_scale": torch.tensor(1.0),
          "out_dtype": torch.float8_e4m3fn}, "in the engine's dtype"),
    ],
)  # fmt: skip
def test_residual_and_fp8_copy_of_the_wrong_shape_are_refused(extra, message):
    """Before any launch: a residual or FP8 copy not shaped as the output, a copy without its
    scale, a copy beside an output that is FP8 itself."""
    require_triton()
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    xq = torch.zeros(4, 16).to(torch.float8_e4m3fn)
    w8 = torch.zeros(8, 16).to(torch.float8_e4m3fn)
    extra = {"out_dtype": torch.float16, **extra}
    with pytest.raises(ValueError, match=message):
        fp8_gemm_triton(xq, w8, torch.ones(8), torch.tensor(1.0), None, "none", **extra)


def test_kernel_rounds_where_the_unfused_engine_stores_under_the_interpreter():
    """With `round_to` the epilogue rounds the sum to fp16 before the activation, as the
    unfused engine stores it: the kernel then equals the op's torch path with the same rounding
    (GELU left out: the interpreter's erf and torch's differ by more than an fp16 step where
    1 + erf cancels), and outputs that differ from the unrounded kernel's show that the rounding
    happened."""
    require_triton()
    same, worst, moved = run_interpreted(
        """
        import torch
        from quantstudy.quant.layers.fused_matmul import fp8_gemm
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(5)
        m, k, n = 96, 48, 40
        xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
        w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(n, generator=g) / 7 + 0.01, torch.tensor(0.37)
        b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
        same, worst, moved = 1.0, 0.0, 0
        for act in ["none", "relu6", "silu", "gelu"]:
            args = (xq, w8, ws, xs, b, act, torch.float16)
            y = fp8_gemm_triton(*args, (32, 32, 32), round_to=torch.float16).float()
            ref = fp8_gemm(*args, None, torch.float16).float()
            unrounded = fp8_gemm_triton(*args, (32, 32, 32)).float()
            moved += int((y != unrounded).sum())
            if act != "gelu":
                same = min(same, (y == ref).float().mean().item())
                # fp16 steps: the spacing at the smaller magnitude, 2^(e-11) for 2^(e-1) <= |v|
                _, e = torch.frexp(torch.minimum(y.abs(), ref.abs()))
                step = torch.exp2((e - 11).clamp_min(-24).float())
                worst = max(worst, ((y - ref).abs() / step).max().item())
        print(same, worst, moved)
        """
    )
    assert float(same) > 0.999 and float(worst) <= 1  # at most one fp16 step
    assert int(moved) > 0  # the rounding place changes some outputs: the path is exercised


def test_streaming_programs_under_the_interpreter_match_torch():
    """Programs that keep the weight and walk over row tiles (8 programs here, so several tiles
    each and a ragged last one), with both stores; and a tile too small for K is refused."""
    require_triton()
    runs, worst = run_interpreted(
        """
        import torch
        from quantstudy.quant.layers.fused_matmul import act_reference
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(1)
        worst, runs = 0.0, 0
        shapes = [(700, 32, 40, 64, 32), (530, 16, 16, 16, 32), (1000, 48, 96, 128, 64)]
        for m, k, n, bn, bk in shapes:
            for act in ["none", "relu6", "gelu"]:
                xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
                w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
                ws, xs = torch.rand(n, generator=g) + 0.5, torch.tensor(0.7)
                b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
                ref = act_reference((xq.float() @ w8.float().t()) * (ws * xs) + b, act)
                for store in ("pointer", "tma"):
                    y = fp8_gemm_triton(
                        xq, w8, ws, xs, b, act, torch.float16, (64, bn, bk), None, store, 2
                    )
                    err = ((y.float() - ref).abs() / (ref.abs() + 1)).max().item()
                    worst, runs = max(worst, err), runs + 1
        try:
            fp8_gemm_triton(xq, w8, ws, xs, b, "none", torch.float16, (64, 128, 32), stream=2)
        except ValueError:
            runs += 100
        print(runs, worst)
        """
    )
    assert int(runs) == 3 * 3 * 2 + 100
    assert float(worst) < 1e-3


class Block(nn.Module):
    """conv -> BN -> ReLU6 (absorbable), a shared ReLU called twice, and a raw output reused."""

    def __init__(self) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(8, 16, 1)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU6()
        self.pw2 = nn.Conv2d(16, 16, 1)
        self.pw3 = nn.Conv2d(16, 16, 1)
        self.relu = nn.ReLU()  # shared: called after pw2 and after pw3
        self.pw4 = nn.Conv2d(16, 16, 1)
        self.act4 = nn.SiLU()
        self.fc1 = nn.Linear(16, 32)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.act1(self.bn1(self.pw1(x)))
        x = self.relu(self.pw2(x))
        x = self.relu(self.pw3(x))
        y = self.pw4(x)
        x = self.act4(y) + y  # the raw output is used again: absorbing act4 would be wrong
        return self.fc2(self.gelu(self.fc1(x.mean((2, 3)))))


def _plan(m, x, layers):
    return QuantPlan(layers, True, calibrate(m, layers, [x]))


def _both_engines(m, x, layers):
    """The fused and the unfused FP8 engine of `m` in fp32 on CPU, from one calibration."""
    plan = _plan(m, x, layers)
    fused = build_fp8(m, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel="fused"))
    unfused = BuildSpec(kernel="scaled_mm")
    return fused, build_fp8(m, CPU, x[:1], plan, dtype=torch.float32, spec=unfused)


def _assert_within_float32_rounding(a_engine, b_engine, x):
    """The fused and the unfused engine agree to a few float32 ulps of the output's scale, not
    bit for bit: both quantize the same float32 values to the same FP8 operands, then the fused
    product (torch's matmul, scale, bias) and torch._scaled_mm (its own kernel, the bias inside)
    sum and scale them in other orders. Measured here at most one ulp of the largest output (torch
    2.14); 16 leave room for another CPU kernel's order and stay far below one FP8 step (2^-4 of
    a value), so an FP8 rounding that moved between the engines would fail. The rewrites
    themselves are checked bit for bit (tests/unit/test_rewrite_check.py)."""
    with torch.no_grad():
        a, b = a_engine(x), b_engine(x)
    ulps = 16 * torch.finfo(torch.float32).eps * a.abs().max()
    assert ((a - b).abs() <= ulps).all(), ((a - b).abs().max(), ulps)


def test_absorption_takes_only_what_keeps_the_output():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 6, 6)
    found = absorbable_activations(m, ["pw1", "pw2", "pw3", "pw4", "fc1", "fc2"], x)
    # pw1's consumer is bn1 (not folded here), pw2/pw3 share a ReLU, pw4's raw output is reused
    # (the hooks see act4 consuming it; the bit-exact check drops it), fc2 has no activation.
    assert found == {"fc1": ("gelu", "gelu")}


class ReluReuse(nn.Module):
    """relu(y) + y: absorbing the ReLU into y's conv is wrong, yet on an input whose y is all
    positive the outputs agree."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.pw(x)
        return self.relu(y) + y


def test_absorption_check_sees_what_an_all_positive_example_hides():
    m = ReluReuse().eval()
    with torch.no_grad():
        m.pw.weight.copy_(torch.eye(4).reshape(4, 4, 1, 1))
        m.pw.bias.fill_(2.0)  # y > 0 for the example below
    example = torch.rand(1, 4, 3, 3)
    assert absorbable_activations(m, ["pw"], example) == {}


def test_fused_engine_agrees_with_unfused_in_fp32():
    torch.manual_seed(0)
    m = Block().eval()
    m.bn1.running_mean.normal_()
    m.bn1.running_var.uniform_(0.5, 2)
    x = torch.randn(4, 8, 6, 6)
    layers = ["pw1", "pw2", "pw3", "pw4", "fc1", "fc2"]
    fused, unfused = _both_engines(m, x, layers)
    # BN folded into pw1 leaves act1 consuming pw1's output: absorbed, as is the GELU
    assert fused.layout.epilogue == {"pw1": "relu6", "fc1": "gelu"}
    assert fused.info().layout.kernel == "fused" and unfused.info().layout.epilogue == {}
    # what torch._scaled_mm wrote is recorded for the unfused engine only
    assert fused.info().layout.scaled_mm_output is None
    assert unfused.info().layout.scaled_mm_output.startswith("float32, bias ")
    assert isinstance(fused.eager.pw1, FusedFP8Matmul) and isinstance(fused.eager.act1, nn.Identity)
    _assert_within_float32_rounding(fused, unfused, x)


def test_activation_names():
    assert activation_name(nn.ReLU(inplace=True)) == "relu"
    assert activation_name(nn.GELU(approximate="tanh")) is None
    assert activation_name(nn.Sigmoid()) is None


def test_gpu_without_fp8_tensor_cores_is_a_clear_error(monkeypatch):
    from quantstudy.record.errors import UserError
    from quantstudy.study.prepare import study_device as _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    with pytest.raises(UserError, match=r"A100 \(compute capability 8.0\) has no FP8"):
        _device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert _device("cuda").type == "cuda"


def test_fused_layer_pads_k_to_16_with_exact_zeros():
    """K 24 becomes 32 (16-byte FP8 rows for vector and descriptor loads); the result is the
    unpadded product's, to the bit, in fp32 compute."""
    from quantstudy.quant.formats.fp8 import quantize_weight, to_fp8

    torch.manual_seed(0)
    conv = nn.Conv2d(24, 40, 1)
    x = torch.randn(2, 24, 5, 5)
    layer = FusedFP8Matmul(conv, FP8LayerSpec(0.01, True, torch.float32, "relu"))
    assert layer.k_pad == 8 and tuple(layer.w8.shape) == (40, 32)
    w8, w_scale = quantize_weight(conv.weight.detach().reshape(40, 24), True)
    x2d = x.permute(0, 2, 3, 1).reshape(-1, 24)
    ref = (to_fp8(x2d, torch.tensor(0.01)).float() @ w8.float().t()) * (w_scale * 0.01)
    ref = (ref + conv.bias.detach()).clamp_min(0).reshape(2, 5, 5, 40).permute(0, 3, 1, 2)
    with torch.no_grad():
        assert torch.equal(layer(x), ref)
    assert "k=24, k_pad=8" in repr(layer)


def test_autotuner_prune_keeps_thin_tiles_and_only_allowed_paths():
    require_triton()
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.quant.kernels.tiles import prune_gemm

    configs = FP8_GEMM.configs

    def kept(m, n, k, loads, store):
        args = {"M": m, "N": n, "K": k, "tma_loads_ok": loads, "tma_store_ok": store}
        return prune_gemm(configs, args)

    thin = kept(1_605_632, 16, 32, 0, 0)  # Lite0's first pointwise conv
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in thin}
    assert (256, 32, 64) in tiles and all(bn <= 64 and bk <= 64 for _, bn, bk in tiles)
    assert not any(c.kwargs["TMA_LOADS"] or c.kwargs["TMA_STORE"] for c in thin)
    both = kept(25_088, 112, 672, 1, 1)
    assert {(c.kwargs["TMA_LOADS"], c.kwargs["TMA_STORE"]) for c in both} == {
        (False, False), (False, True), (True, False), (True, True)
    }  # fmt: skip
    assert not any(c.kwargs["STREAM"] for c in both)  # K 672: no streaming tile holds it
    assert max(c.kwargs["BLOCK_K"] for c in both) == 128  # the default promotes every 128
    shallow = prune_gemm(configs, {"M": 25_088, "N": 112, "K": 672, "tma_loads_ok": 1,
                               "tma_store_ok": 1}, PROMOTE=64)  # fmt: skip
    assert shallow and max(c.kwargs["BLOCK_K"] for c in shallow) == 64
    # a thin expansion conv (Lite0, K 16, N 96): streaming tiles that hold all of K and N exactly
    stream = [c for c in kept(1_605_632, 96, 16, 0, 1) if c.kwargs["STREAM"]]
    assert {(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["PER_SM"]) for c in stream} == {
        (128, 32, 2), (128, 32, 4)
    }  # fmt: skip
    assert {c.kwargs["TMA_STORE"] for c in stream} == {False, True}
    small = kept(1, 8, 8, 0, 0)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in small] == [
        (64, 32, 64)
    ]
    wide = [c for c in configs if c.kwargs["BLOCK_M"] >= 128]  # none fits: the smallest tile
    args = {"M": 1, "N": 8, "K": 8, "tma_loads_ok": 0, "tma_store_ok": 0}
    fallback = prune_gemm(wide, args)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in fallback] == [
        (128, 64, 32)
    ]


class MlpPair(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 (a hand-off), and fc3 whose output is also reused."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 16)
        self.fc4 = nn.Linear(16, 8)

    def forward(self, x):
        x = x.flatten(2).transpose(1, 2)  # (B, 16, H, W) images -> (B, HW, 16) tokens
        x = self.fc2(self.drop(self.act(self.fc1(x))))
        y = self.fc3(x)
        return self.fc4(y) + y.mean()  # fc3's output is read by fc4 and by the mean


def test_handoff_takes_the_mlp_pair_and_not_a_reused_output():
    from quantstudy.quant.rewrites.handoff import fp8_handoffs

    torch.manual_seed(0)
    m = MlpPair().eval()
    x = torch.randn(4, 16, 3, 3)
    layers = ["fc1", "fc2", "fc3", "fc4"]
    absorbed = absorbable_activations(m, layers, x)
    assert absorbed == {"fc1": ("act", "gelu")}
    # fc1 -> (gelu, dropout) -> fc2 and fc2 -> fc3 hand off; fc3 -> fc4 links by tensor identity
    # too, but fc3's output is also read by the mean, which only the exactness check sees
    assert fp8_handoffs(m, layers, x, absorbed) == {"fc1": "fc2", "fc2": "fc3"}


def test_fp8_engine_with_handoff_agrees_with_the_unfused_engine_without():
    """The hand-off moves the consumer's quantize into the producer's epilogue: the same FP8
    values (fp32 compute on CPU quantizes the same float32 numbers), so the fused engine with
    hand-offs agrees with the unfused one, which has none, to float32 rounding."""
    torch.manual_seed(0)
    m = MlpPair().eval()
    x = torch.randn(4, 16, 3, 3)
    layers = ["fc1", "fc2", "fc3", "fc4"]
    fused, unfused = _both_engines(m, x, layers)
    assert fused.info().layout.handoff == {"fc1": "fc2", "fc2": "fc3"}
    assert unfused.info().layout.handoff == {}
    assert fused.eager.fc1.out_scale is not None and fused.eager.fc2.fp8_input
    _assert_within_float32_rounding(fused, unfused, x)


class ResidualBlock(nn.Module):
    """conv3 -> bn3 (zero-initialised, as timm's ResNets) -> `out += shortcut` -> act -> next
    conv: the act and the next conv read conv3's output object after an in-place change."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 16, 1)
        self.conv3 = nn.Conv2d(16, 16, 1)
        self.bn3 = nn.BatchNorm2d(16)
        nn.init.zeros_(self.bn3.weight)
        self.act = nn.ReLU(inplace=True)
        self.conv_next = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        shortcut = torch.relu(self.conv1(x))
        out = self.bn3(self.conv3(shortcut))
        out += shortcut
        return self.conv_next(self.act(out))


def test_in_place_residual_add_breaks_absorption_and_handoff():
    """With the zero-initialised BN the branch adds exact zeros, so a value check alone would
    pass; the tensor's version counter shows the in-place add."""
    from quantstudy.quant.rewrites.fold import fold_batchnorm
    from quantstudy.quant.rewrites.handoff import fp8_handoffs

    torch.manual_seed(0)
    m = ResidualBlock().eval()
    x = torch.randn(2, 16, 4, 4)
    fold_batchnorm(m, x)
    layers = ["conv1", "conv3", "conv_next"]
    absorbed = absorbable_activations(m, layers, x)
    assert absorbed == {}
    assert fp8_handoffs(m, layers, x, absorbed) == {}


class ConvFFN(nn.Module):
    """MobileNetV4's FFN block shape: pw expand -> BN -> ReLU -> pw project, plus a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.pw_exp = nn.Conv2d(16, 64, 1)
        self.bn = nn.BatchNorm2d(64)
        self.act = nn.ReLU()
        self.pw_proj = nn.Conv2d(64, 16, 1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = x + self.pw_proj(self.act(self.bn(self.pw_exp(x))))
        return self.head(x.mean((2, 3)))


def test_conv_to_conv_handoff_runs_channels_last_fp8_between_them():
    torch.manual_seed(0)
    m = ConvFFN().eval()
    m.bn.running_mean.normal_()
    m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(4, 16, 6, 6)
    layers = ["pw_exp", "pw_proj", "head"]
    fused, unfused = _both_engines(m, x, layers)
    assert fused.info().layout.handoff == {"pw_exp": "pw_proj"}
    assert fused.info().layout.epilogue == {"pw_exp": "relu"}
    _assert_within_float32_rounding(fused, unfused, x)


def test_fp8_io_is_refused_where_it_cannot_be_right():
    """A hand-off consumer whose K would need padding, a consumer given a float input, and an
    FP8 output without its scale (or a scale without an FP8 output) are clear errors."""
    require_triton()
    from quantstudy.quant.formats.fp8 import E4M3
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton

    with pytest.raises(ValueError, match="cannot be padded"):
        FusedFP8Matmul(nn.Linear(24, 8), FP8LayerSpec(0.1, True, torch.float32, fp8_input=True))
    consumer = FusedFP8Matmul(
        nn.Linear(32, 8), FP8LayerSpec(0.1, True, torch.float32, fp8_input=True)
    )
    with pytest.raises(TypeError, match="reads FP8"):
        consumer(torch.randn(2, 32))
    xq, w8 = torch.zeros(4, 32, dtype=E4M3), torch.zeros(8, 32, dtype=E4M3)
    ws, xs = torch.ones(8), torch.tensor(1.0)
    with pytest.raises(ValueError, match="needs out_scale"):
        fp8_gemm_triton(xq, w8, ws, xs, None, "none", E4M3)
    with pytest.raises(ValueError, match="needs out_scale"):
        fp8_gemm_triton(xq, w8, ws, xs, None, "none", torch.float16, out_scale=xs)
