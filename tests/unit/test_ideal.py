"""The ideal x at the FP8 roofline (`speed/ideal.py`), on constructed records: every expected
figure below is worked out by hand from the layer shapes and the H200's datasheet peaks."""

import pytest

from quantstudy.record import (
    BatchSpeed,
    EngineInfo,
    KernelBreakdown,
    KernelGroupTime,
    LayerDecision,
    RecipeInfo,
    SpeedSection,
    TimingStats,
)
from quantstudy.record.vocab import KernelGroup
from quantstudy.speed.ideal import ideal_for_batch, ideal_speed, layer_cost, peaks_for

H200 = peaks_for("NVIDIA H200")
BYTES_PER_US = 4.8e6  # 4.8 TB/s
FP8_FLOP_PER_US = 1979e6


def _layer(name, op="conv2d", cin=256, cout=256, hw=(32, 32), kernel=(1, 1), stride=(1, 1),
           groups=1, selected=True) -> LayerDecision:  # fmt: skip
    conv = op == "conv2d"
    return LayerDecision(
        name=name, op=op, module_class="Conv2d" if conv else "Linear",
        kernel=kernel if conv else None, stride=stride if conv else None, groups=groups,
        in_channels=cin, out_channels=cout, input_hw=hw, selected=selected, rule=0, reason="t",
    )  # fmt: skip


def _recipe(selected, excluded=()) -> RecipeInfo:
    return RecipeInfo(
        name="t", source="builtin:t", sha256="0", description="", format="fp8_e4m3",
        weight_granularity="per_channel", fold_bn=True, calibrator="amax", calibrator_params={},
        selected=list(selected), excluded=list(excluded), counts={},
    )  # fmt: skip


def _engine(real=(), emulated=(), epilogue=None) -> EngineInfo:
    return EngineInfo(
        name="fp8", compute_dtype="float16", device="cuda", compiled=True,
        fp8_real=list(real), fp8_emulated=list(emulated), fp8_epilogue=epilogue or {},
        fp16_layers=0, weight_bytes=0, numerics={},
    )  # fmt: skip


def _stats(v: float) -> TimingStats:
    return TimingStats(median=v, q1=v, q3=v, min=v, max=v, n=1)


def _batch(batch=128, fp16_ms=1.0, x=1.05) -> BatchSpeed:
    return BatchSpeed(
        batch=batch, fp16_ms=_stats(fp16_ms), fp8_ms=_stats(fp16_ms / x), ratio=_stats(x),
        warnings=[],
    )  # fmt: skip


def _profile(engine, batch=128, mm=0.0, other=0.0, dw=0.0) -> KernelBreakdown:
    times = {KernelGroup.FP16_MATMUL_CONV: mm, KernelGroup.OTHER: other,
             KernelGroup.DEPTHWISE_CONV: dw}  # fmt: skip
    groups = [KernelGroupTime(group=g, time_us=times.get(g, 0.0), count=1) for g in KernelGroup]
    return KernelBreakdown(
        engine=engine, batch=batch, kernel_count=1, total_us=mm + other + dw, groups=groups,
        top_kernels=[],
    )  # fmt: skip


def test_peaks_come_from_the_gpu_name():
    assert peaks_for("cuda:0 (NVIDIA H200)") == H200
    assert (H200.fp8_tflops, H200.fp16_tflops, H200.hbm_tbs) == (1979, 989, 4.8)
    assert peaks_for("NVIDIA H100 PCIe").hbm_tbs == 2.0
    assert peaks_for("NVIDIA H100 80GB HBM3").hbm_tbs == 3.35
    assert peaks_for("NVIDIA A100-SXM4-80GB") is None  # no FP8 tensor cores


def test_layer_shapes():
    strided = layer_cost(_layer("a", cin=64, cout=32, hw=(15, 15), stride=(2, 2)), 2)
    assert (strided.m, strided.k, strided.n) == (2 * 8 * 8, 64, 32)
    assert strided.in_elems == 2 * 8 * 8 * 64  # a strided 1x1 conv reads the pixels it keeps
    k3 = layer_cost(_layer("b", cin=26, cout=26, hw=(56, 56), kernel=(3, 3)), 4)
    assert (k3.m, k3.k, k3.n) == (4 * 56 * 56, 26 * 9, 26)
    assert (k3.in_elems, k3.weight_elems) == (4 * 56 * 56 * 26, 26 * 9 * 26)  # map read once
    lin = layer_cost(_layer("c", op="linear", cin=384, cout=1536, hw=(401, 1)), 3)
    assert (lin.m, lin.k, lin.n, lin.is_conv) == (3 * 401, 384, 1536, False)
    assert layer_cost(_layer("d", groups=256, kernel=(3, 3)), 1) is None  # depthwise
    assert layer_cost(_layer("e", hw=None), 1) is None  # never ran in the example


def test_ideal_of_one_real_layer_by_hand():
    # 1x1 conv 256 -> 256 on 32x32 at batch 128: M 131072. FP8 bytes: input M*256, weight
    # 256*256, fp16 output 2*M*256; its bias pass in fp16 reads and writes 2*M*256 each.
    m = 128 * 32 * 32
    bytes8 = m * 256 + 256 * 256 + 2 * m * 256
    roof8 = max(bytes8 / BYTES_PER_US, 2 * m * 256 * 256 / FP8_FLOP_PER_US)
    passes = 4 * m * 256 / BYTES_PER_US
    products = 100.0 - 40.0  # the dense group shrank by the layer's fp16 product
    want_ms = 1.0 - (products + passes - roof8) / 1000
    got = ideal_for_batch(
        _batch(x=1.05), _profile("fp16", mm=100, other=500), _profile("fp8", mm=40),
        _recipe([_layer("a")]), _engine(real=["a"]), H200, "NVIDIA H200",
    )  # fmt: skip
    assert got.layers == 1
    assert got.fp16_products_us == pytest.approx(60.0)
    assert got.fp16_elementwise_us == pytest.approx(passes)
    assert got.fp8_roofline_us == pytest.approx(roof8)
    assert roof8 == pytest.approx(bytes8 / BYTES_PER_US)  # memory-bound: 21 us against 8.7
    assert got.ideal_x == pytest.approx(1.0 / want_ms)
    assert got.fraction == pytest.approx(1.05 * want_ms)
    assert "H200" in got.peaks and "1979" in got.peaks


def test_selected_depthwise_convs_take_their_share_of_the_depthwise_time_at_fp8_storage():
    # Two 3x3 depthwise convs, 64 and 128 channels on 28x28 at batch 128, both in the fp16
    # engine's 300 us depthwise group; the recipe selects the second (FP8 storage). fp16 bytes:
    # input and weight 2 per element, fp16 output; at FP8 storage input and taps take 1.
    def dw(name, c, selected=True):
        return _layer(name, cin=c, cout=c, hw=(28, 28), kernel=(3, 3), groups=c,
                      selected=selected)  # fmt: skip

    px = 128 * 28 * 28
    bytes16 = {c: px * c * 2 + 2 * c * 9 + 2 * px * c for c in (64, 128)}
    bytes8 = px * 128 + 128 * 9 + 2 * px * 128
    dw16 = 300.0 * bytes16[128] / (bytes16[64] + bytes16[128])
    roof8, passes = bytes8 / BYTES_PER_US, 4 * px * 128 / BYTES_PER_US
    got = ideal_for_batch(
        _batch(fp16_ms=1.0), _profile("fp16", other=500, dw=300), _profile("fp8", dw=100),
        _recipe([dw("b", 128)], [dw("a", 64, selected=False)]), _engine(real=["b"]), H200,
        "NVIDIA H200",
    )  # fmt: skip
    assert got.layers == 1
    assert got.fp16_products_us == pytest.approx(dw16)  # 200 us: 2/3 of the group
    assert got.fp8_roofline_us == pytest.approx(roof8)
    assert got.fp16_elementwise_us == pytest.approx(passes)
    assert got.ideal_x == pytest.approx(1.0 / (1.0 - (dw16 + passes - roof8) / 1000))


def test_elementwise_is_capped_by_the_fp16_engines_pointwise_time():
    got = ideal_for_batch(
        _batch(), _profile("fp16", mm=100, other=5), _profile("fp8", mm=40),
        _recipe([_layer("a")]), _engine(real=["a"]), H200, "NVIDIA H200",
    )  # fmt: skip
    assert got.fp16_elementwise_us == 5


def test_a_linear_pays_a_pass_only_for_an_absorbed_activation():
    fc1 = _layer("fc1", op="linear", cin=384, cout=1536, hw=(401, 1))
    fc2 = _layer("fc2", op="linear", cin=1536, cout=384, hw=(401, 1))
    args = (_batch(), _profile("fp16", mm=100, other=500), _profile("fp8", mm=40))
    got = ideal_for_batch(*args, _recipe([fc1, fc2]), _engine(["fc1", "fc2"], [], {"fc1": "gelu"}),
                          H200, "NVIDIA H200")  # fmt: skip
    assert got.fp16_elementwise_us == pytest.approx(4 * 128 * 401 * 1536 / BYTES_PER_US)


def test_emulated_layers_take_their_roofline_share_of_the_remaining_dense_time():
    # The FP8 engine's dense group (300 us) holds the emulated 3x3 conv and the unselected
    # stem; at equal fp16 rooflines each is half of it.
    k3 = _layer("k3", cin=64, cout=64, hw=(56, 56), kernel=(3, 3))
    stem = _layer("stem", cin=64, cout=64, hw=(56, 56), kernel=(3, 3), selected=False)
    got = ideal_for_batch(
        _batch(), _profile("fp16", mm=300, other=0), _profile("fp8", mm=300),
        _recipe([k3], [stem]), _engine(emulated=["k3"]), H200, "NVIDIA H200",
    )  # fmt: skip
    assert got.fp16_products_us == pytest.approx(150.0)


def test_layers_kept_in_fp16_take_their_share_of_the_fp8_engines_dense_time_like_emulated_ones():
    """A layer the fastest choice kept in fp16 still runs its fp16 product inside the FP8
    engine's dense group, so the fp16 time the recipe could save includes its share there."""
    from quantstudy.record import LayerKernel

    k3 = _layer("k3", cin=64, cout=64, hw=(56, 56), kernel=(3, 3))
    stem = _layer("stem", cin=64, cout=64, hw=(56, 56), kernel=(3, 3), selected=False)
    kept = _engine().model_copy(update={
        "fp8_kernel_choice": [LayerKernel(name="k3", kernel="fp16", fused_us=9.0, fp16_us=5.0)],
        "fp8_stepped_aside": ["k3"],
    })  # fmt: skip
    got = ideal_for_batch(
        _batch(), _profile("fp16", mm=300, other=0), _profile("fp8", mm=300),
        _recipe([k3], [stem]), kept, H200, "NVIDIA H200",
    )  # fmt: skip
    assert got.fp16_products_us == pytest.approx(150.0)


def _speed(device="cuda:0 (NVIDIA H200)", meaningful=True, kernels=True) -> SpeedSection:
    profiles = [_profile("fp16", mm=100, other=500), _profile("fp8", mm=40)] if kernels else []
    return SpeedSection(
        device=device, meaningful=meaningful, compile_mode="default", timed_region="t",
        rounds=1, iters_per_round=1, warmup=0, input_buffers=1, clocks={},
        batches=[_batch(1), _batch(128)], kernels=profiles, weight_bytes={},
    )  # fmt: skip


def test_ideal_speed_per_batch_and_why_not():
    recipe, engines = _recipe([_layer("a")]), [_engine(real=["a"])]
    found, why = ideal_speed(_speed(), recipe, engines, "NVIDIA H200")
    assert why is None and [i.batch for i in found] == [128]  # batch 1 has no profile here
    for speed, gpu, words in [
        (_speed(meaningful=False), None, "GPU timings"),
        (_speed(kernels=False), None, "GPU timings"),
        (_speed(device="cuda:0 (NVIDIA A100)"), "NVIDIA A100", "no FP8 peaks"),
    ]:
        found, why = ideal_speed(speed, recipe, engines, gpu)
        assert found is None and words in why
    assert ideal_speed(_speed(), None, engines, None)[0] is None
    # the record keeps it: an optional field, so records without it still load
    stored = _speed().model_copy(update={"ideal": ideal_speed(_speed(), recipe, engines, None)[0]})
    assert SpeedSection.model_validate(stored.model_dump()).ideal[0].batch == 128
    assert SpeedSection.model_validate(_speed().model_dump()).ideal is None


def test_report_shows_the_ideal_beside_the_measured_x():
    from quantstudy.report.sections.ideal import ideal_lines

    assert ideal_lines(None) == []  # a record without the field renders nothing
    found, _ = ideal_speed(_speed(), _recipe([_layer("a")]), [_engine(real=["a"])], None)
    text = "\n".join(ideal_lines(found))
    row = f"| 128 | 1 | 60.0 | {found[0].fp16_elementwise_us:.1f} |"
    assert row in text and f"{100 * found[0].fraction:.2f}%" in text and "NVIDIA H200" in text


def test_report_lists_the_kernel_each_layer_runs():
    from quantstudy.record import LayerKernel
    from quantstudy.report.sections.ideal import kernel_choice_lines

    assert kernel_choice_lines(None) == []
    choice = [
        LayerKernel(name="a", kernel="fused", fused_us=1.0, scaled_mm_us=2.0, batch=1),
        LayerKernel(name="a", kernel="scaled_mm", fused_us=10.0, scaled_mm_us=5.0, batch=128),
        LayerKernel(name="b", kernel="fused", why="FP8 hand-off"),
    ]
    text = "\n".join(kernel_choice_lines(choice))
    assert "scaled_mm runs at batch 1, 0 of 2; at batch 128, 1 of 2 FP8 layers." in text
    assert "| a | scaled_mm | 10.0 | 5.0 | not measured | 128 | - |" in text
    assert "| b | fused | not measured | not measured | not measured | - | FP8 hand-off |" in text
    assert "Kept in fp16" not in text


def test_report_says_which_layers_stepped_aside_with_their_timings():
    from quantstudy.record import LayerKernel
    from quantstudy.report.sections.ideal import kernel_choice_lines

    choice = [
        LayerKernel(name="c", kernel="fp16", fused_us=10.0, fp16_us=6.0, batch=1),
        LayerKernel(name="c", kernel="fp16", fused_us=40.0, fp16_us=30.0, batch=128),
        LayerKernel(name="d", kernel="fused", fused_us=10.0, fp16_us=6.0, batch=1),
        LayerKernel(name="d", kernel="fused", fused_us=40.0, fp16_us=50.0, batch=128),
    ]
    text = "\n".join(kernel_choice_lines(choice, ["c"]))
    assert "Kept in fp16 (FP8 slower at every timed batch): 1 layer, `c`." in text
    assert "at batch 128, 0 of 1 FP8 layers" in text
    assert "| c | fp16 | 40.0 | not measured | 30.0 | 128 | - |" in text
    assert "| d | fused | 40.0 | not measured | 50.0 | 128 | - |" in text
