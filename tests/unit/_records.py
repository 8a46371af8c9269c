"""Constructed, internally consistent study records for the policy and report tests.

`build_record(...)` makes a schema-valid `StudyRecord` shaped like the MobileNetV4 seed study
(mobilenetv4_conv_large, 54 FP8 1x1 convs, batches 1/32/128 on an H200), but every number is
derived here from simulated per-image outcomes and per-round timings, so the record is
self-consistent: agreement = 1 - differ/n, top-1 from correct counts, the CI from a paired
bootstrap of those outcomes, McNemar from the discordant pairs, KL statistics and histogram from
one sample, timing quartiles and ratios from the same interleaved rounds. No value is a measured
result: this is test data.

`python tests/unit/_records.py` rewrites tests/fixtures/study_example.json (the default record
with the default policy's decision); a test checks that the file matches this builder.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

from quantstudy.decision.policy import decide, load_policy
from quantstudy.quality.metrics import KL_INTERVAL_LEVELS
from quantstudy.quality.paired import bootstrap_mean_intervals
from quantstudy.record import (
    BatchSpeed,
    CalibrationInfo,
    DataInfo,
    EmulationGap,
    EngineInfo,
    EngineQuality,
    Environment,
    ImageSet,
    KernelBreakdown,
    KernelGroupTime,
    LayerDecision,
    MeanInterval,
    ModelInfo,
    NonFiniteScan,
    Preprocessing,
    QualitySection,
    RecipeInfo,
    SkippedImage,
    SpeedSection,
    StudyConfig,
    StudyRecord,
    TensorScale,
    TimingStats,
    Variant,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "study_example.json"

N_HELDOUT = 1500
N_CALIB = 500
N_CORRECT_REF = 1223  # fp32 top-1 81.53% on 1500 images
N_TOP5_REF = 1433
# 10 ** (-7 + i/4) by Python's pow, not np.logspace: numpy's vectorized power (SIMD on some
# CPUs) rounds some of these an ulp differently from the C library's, so the fixture would
# follow the CPU that built it.
KL_EDGES = [10.0 ** (-7 + i / 4) for i in range(33)]
STRESS = [
    "blank_zero",
    "blank_mean",
    "saturated_white",
    "saturated_black",
    "noise_std_0.1",
    "noise_std_1",
    "noise_std_10",
    "checkerboard_8",
    "checkerboard_32",
    "impulse_center",
    "extreme_pos_1e4",
    "extreme_neg_1e4",
]

# (gained, lost, wrong_to_wrong, kl_scale) per engine against fp32; the seed-like default.
DEFAULT_OUTCOMES = {
    "fp16": (0, 0, 0, 2.0e-6),
    "fp8": (20, 22, 1, 0.011),
    "fakequant": (19, 21, 2, 0.0108),
    "fakequant_weights": (3, 4, 0, 0.0016),
    "fakequant_activations": (16, 19, 1, 0.0089),
}
# fp16 ms per batch (median over rounds) and FP8 speed-up x per batch.
FP16_MS = {1: 1.214, 32: 4.871, 128: 17.93}
DEFAULT_SPEEDUP = {1: 1.01, 32: 0.96, 128: 0.93}


# --- the network: timm mobilenetv4_conv_large at 256 x 256 ---------------------------------

# (stage, blocks, out channels, expansion, spatial size of the block input)
_UIR_STAGES = [(1, 2, 96, 4, 64), (2, 11, 192, 4, 32), (3, 13, 512, 4, 16)]


def _layers() -> tuple[list[LayerDecision], list[LayerDecision]]:
    sel: list[LayerDecision] = []
    exc: list[LayerDecision] = []

    def conv(name, k, s, g, cin, cout, hw, selected, rule, reason):
        (sel if selected else exc).append(
            LayerDecision(
                name=name,
                op="conv2d",
                module_class="Conv2d",
                kernel=(k, k),
                stride=(s, s),
                groups=g,
                in_channels=cin,
                out_channels=cout,
                input_hw=(hw, hw),
                selected=selected,
                rule=rule,
                reason=reason,
            )
        )

    pw_reason = "rule 0 selects conv2d 1x1 dense under blocks.*"
    dw_reason = "rule 1 excludes depthwise conv2d (groups == in_channels)"
    conv("conv_stem", 3, 2, 1, 3, 24, 256, False, None, "no rule matched: default off")
    conv("blocks.0.0.conv_exp", 3, 2, 1, 24, 96, 128, False, None, "no rule matched: default off")
    conv("blocks.0.0.conv_pwl", 1, 1, 1, 96, 48, 64, True, 0, pw_reason)
    cin = 48
    for stage, blocks, cout, exp, hw in _UIR_STAGES:
        for i in range(blocks):
            pre = f"blocks.{stage}.{i}"
            stride = 2 if i == 0 else 1
            # a depthwise start conv in every block but each third one; a depthwise mid conv
            # in every block (19 + 26 = 45 depthwise convs)
            if i % 3 != 2:
                conv(f"{pre}.dw_start.conv", 3, stride, cin, cin, cin, hw, False, 1, dw_reason)
            hw_mid = hw // stride
            mid = cin * exp
            conv(f"{pre}.pw_exp.conv", 1, 1, 1, cin, mid, hw_mid, True, 0, pw_reason)
            conv(f"{pre}.dw_mid.conv", 3, 1, mid, mid, mid, hw_mid, False, 1, dw_reason)
            conv(f"{pre}.pw_proj.conv", 1, 1, 1, mid, cout, hw_mid, True, 0, pw_reason)
            cin = cout
            hw = hw_mid
    conv("blocks.4.0.conv", 1, 1, 1, 512, 960, 8, True, 0, pw_reason)
    conv("conv_head", 1, 1, 1, 960, 1280, 1, False, 2, "rule 2 excludes the head: 1x1 input map")
    exc.append(
        LayerDecision(
            name="classifier",
            op="linear",
            module_class="Linear",
            in_channels=1280,
            out_channels=1000,
            selected=False,
            rule=None,
            reason="no rule matched: default off",
        )
    )
    return sel, exc


# --- quality --------------------------------------------------------------------------------


def _mcnemar_exact(gained: int, lost: int) -> float:
    """Exact two-sided McNemar p (binomial at 1/2 on the discordant pairs), in exact fractions:
    scipy's binomtest rounds its sum differently across releases (an ulp between 1.11 and
    1.17), which the fixture would follow."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def _kl_sample(rng: np.random.Generator, scale: float, differ: int) -> np.ndarray:
    kl = rng.lognormal(mean=0.0, sigma=1.1, size=N_HELDOUT)
    kl *= scale / kl.mean()
    if differ:
        kl[:differ] *= 6.0  # images whose top-1 changes carry larger KL
        kl *= scale / kl.mean()
    return kl


def _engine_quality(
    name: str,
    gained: int,
    lost: int,
    w2w: int,
    kl_scale: float,
    *,
    labelled: bool,
    seed: int,
) -> EngineQuality:
    rng = np.random.default_rng(seed)
    differ = gained + lost + w2w
    kl = _kl_sample(rng, kl_scale, differ)
    hist, _ = np.histogram(np.clip(kl, KL_EDGES[0], KL_EDGES[-1]), bins=KL_EDGES)
    common = dict(
        engine=name,
        n_images=N_HELDOUT,
        labelled=labelled,
        agreement=1.0 - differ / N_HELDOUT,
        differ_count=differ,
        kl_mean=float(kl.mean()),
        kl_median=float(np.median(kl)),
        kl_p99=float(np.quantile(kl, 0.99)),
        kl_max=float(kl.max()),
        max_abs_logit_diff=float(0.02 + 40.0 * kl.max()),
        kl_histogram=[int(c) for c in hist],
        kl_bin_edges=KL_EDGES,
        kl_mean_intervals=[
            MeanInterval(level=level, low=low, high=high)
            for level, low, high in bootstrap_mean_intervals(
                kl, KL_INTERVAL_LEVELS, resamples=2000, seed=seed
            )
        ],
    )
    if not labelled:
        return EngineQuality(**common)
    # paired bootstrap of the per-image change in correctness (+1 gained, -1 lost, 0 else):
    # resampling n images draws multinomial counts of the three outcomes
    draws = rng.multinomial(
        N_HELDOUT,
        [gained / N_HELDOUT, lost / N_HELDOUT, 1.0 - (gained + lost) / N_HELDOUT],
        size=1000,
    )
    means = (draws[:, 0] - draws[:, 1]) / N_HELDOUT
    p = _mcnemar_exact(gained, lost)
    top5_shift = (gained - lost) // 2
    return EngineQuality(
        **common,
        top1=(N_CORRECT_REF + gained - lost) / N_HELDOUT,
        top5=(N_TOP5_REF + top5_shift) / N_HELDOUT,
        top1_reference=N_CORRECT_REF / N_HELDOUT,
        gained=gained,
        lost=lost,
        wrong_to_wrong=w2w,
        net_change=gained - lost,
        top1_change=(gained - lost) / N_HELDOUT,
        ci_low=float(np.quantile(means, 0.025)),
        ci_high=float(np.quantile(means, 0.975)),
        bootstrap_resamples=1000,
        bootstrap_seed=0,
        mcnemar_p=float(p),
    )


# --- speed ----------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """numpy's default ("linear") quantile in plain Python floats: the fixture's timing
    quartiles then do not follow a numpy release's quantile internals (its virtual index and
    interpolation formulas, which may change by an ulp between releases); the formula is
    numpy 2.4's, so records built with it equal those it built."""
    s = sorted(values)
    v = (len(s) - 1) * q
    i = min(int(v), len(s) - 1)
    a, b = s[i], s[min(i + 1, len(s) - 1)]
    t = v - i
    return b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t


def _stats(x: list[float]) -> TimingStats:
    return TimingStats(
        median=_quantile(x, 0.5),
        q1=_quantile(x, 0.25),
        q3=_quantile(x, 0.75),
        min=min(x),
        max=max(x),
        n=len(x),
    )


def _normal(draws: random.Random) -> float:
    """About N(0, 1): the sum of 12 uniforms less 6 (Irwin-Hall), summed by `math.fsum`
    (correctly rounded). Python promises `random()`'s sequence for a seed, not
    `normalvariate`'s; numpy does not promise `Generator.standard_normal` across releases; and
    the built-in `sum` of floats rounds differently from Python 3.12 on (compensated summation).
    The fixture's timings then match on every Python, numpy and libm."""
    return math.fsum(draws.random() for _ in range(12)) - 6.0


def _batch_speed(batch: int, speedup: float, noise: float, seed: int, rounds: int) -> BatchSpeed:
    draws = random.Random(seed)
    z16 = [_normal(draws) for _ in range(rounds)]
    z8 = [_normal(draws) for _ in range(rounds)]
    fp16 = [FP16_MS[batch] * (1.0 + noise * z) for z in z16]
    fp8 = [FP16_MS[batch] / speedup * (1.0 + noise * z) for z in z8]
    ratio = [a / b for a, b in zip(fp16, fp8, strict=True)]
    st = _stats(ratio)
    warnings = []
    if st.q3 - st.q1 > 0.04 * st.median:
        warnings.append(
            "x spread (q3 - q1) is more than 4% of its median: ratios within it are noise"
        )
    return BatchSpeed(
        batch=batch, fp16_ms=_stats(fp16), fp8_ms=_stats(fp8), ratio=st, warnings=warnings
    )


def _kernels(batch: int, fp16_ms: float, fp8_ms: float) -> list[KernelBreakdown]:
    total16 = fp16_ms * 1000.0 * 0.97
    total8 = fp8_ms * 1000.0 * 0.97
    g16 = [
        KernelGroupTime(group="fp16_matmul_conv", time_us=total16 * 0.58, count=56),
        KernelGroupTime(group="depthwise_conv", time_us=total16 * 0.27, count=45),
        KernelGroupTime(group="quantize_convert", time_us=0.0, count=0),
        KernelGroupTime(group="other", time_us=total16 * 0.15, count=61),
    ]
    g8 = [
        KernelGroupTime(group="fp8_matmul", time_us=total8 * 0.41, count=54),
        KernelGroupTime(group="fp16_matmul_conv", time_us=total8 * 0.05, count=2),
        KernelGroupTime(group="depthwise_conv", time_us=total8 * 0.24, count=45),
        KernelGroupTime(group="quantize_convert", time_us=total8 * 0.16, count=54),
        KernelGroupTime(group="other", time_us=total8 * 0.14, count=61),
    ]

    def bd(engine: str, groups: list[KernelGroupTime], top: str) -> KernelBreakdown:
        return KernelBreakdown(
            engine=engine,
            batch=batch,
            kernel_count=sum(g.count for g in groups),
            total_us=math.fsum(g.time_us for g in groups),  # not sum(): see _normal
            groups=groups,
            top_kernels=[(top, max(g.time_us for g in groups) / 9.0)],
        )

    return [
        bd("fp16", g16, "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_nhwc_tilesize128x128x64"),
        bd("fp8", g8, "sm90_xmma_gemm_e4m3e4m3_f16_f32_tn_n_tilesize128x128x128_cluster1x2x1"),
    ]


# --- the record -----------------------------------------------------------------------------


def _ids(prefix: str, n: int, offset: int) -> list[str]:
    return [f"n{1440764 + (i * 37) % 725:08d}/{prefix}_{offset + i:08d}.JPEG" for i in range(n)]


def _sha(items: list[str]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()


def build_record(
    *,
    speedup: dict[int, float] | None = None,
    noise: float = 0.012,
    outcomes: dict[str, tuple[int, int, int, float]] | None = None,
    random_weights: bool = False,
    labelled: bool = True,
    device: str = "cuda",
    fp8_weight_bytes: int = 37_748_736,
    nonfinite: dict[str, list[str]] | None = None,
    partial: bool = False,
    with_variant: bool = True,
    with_decision: bool = True,
    against_fp16: tuple[int, int, int, float] | None = None,
) -> StudyRecord:
    """A consistent study record; keyword arguments change one aspect of the default study.

    `against_fp16` gives the FP8 engine's (gained, lost, wrong_to_wrong, kl_scale) against the
    fp16 engine; by default those against fp32 (as if fp16 matched fp32 image by image)."""
    speedup = dict(DEFAULT_SPEEDUP if speedup is None else speedup)
    outcomes = {**DEFAULT_OUTCOMES, **(outcomes or {})}
    nonfinite = nonfinite or {}
    on_gpu = device == "cuda"
    batches = sorted(speedup)
    selected, excluded = _layers()
    emulated = ["blocks.0.0.conv_pwl"]  # in_channels 96 -> out 48: kept emulated in this fixture
    real = [layer.name for layer in selected if layer.name not in emulated]

    env = Environment(
        python="3.12.3",
        platform="Linux-6.8.0-1021-nvidia-x86_64-with-glibc2.39",
        cpu="Intel(R) Xeon(R) Platinum 8480C",
        cpu_count=16,
        torch_threads=16,
        torch="2.14.1+cu130" if on_gpu else "2.14.1+cpu",
        timm="1.0.28",
        numpy="2.4.6",
        cuda="13.0" if on_gpu else None,
        cudnn="91300" if on_gpu else None,
        gpu_name="NVIDIA H200" if on_gpu else None,
        gpu_driver="580.95.05" if on_gpu else None,
        gpu_capability="9.0" if on_gpu else None,
        quantstudy="0.1.0",
        git_commit="13b28bb5e0c4d7f1a9b2c3d4e5f60718293a4b5c",
        created_utc="2026-11-20T14:03:11Z",
    )
    model = ModelInfo(
        name="mobilenetv4_conv_large.e500_r256_in1k",
        architecture="mobilenetv4_conv_large",
        pretrained_tag=None if random_weights else "e500_r256_in1k",
        weights="random" if random_weights else "cache",
        weights_detail="random init, seed 0"
        if random_weights
        else "hf-hub:timm/mobilenetv4_conv_large.e500_r256_in1k",
        weights_sha256=None
        if random_weights
        else "5b1f0c0e8d2a6f4e3c9b7a1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f",
        random_weights=random_weights,
        seed=0,
        num_params=32_587_632,
        num_classes=1000,
    )
    pre = Preprocessing(
        input_size=(3, 256, 256),
        crop_pct=0.95,
        crop_mode="center",
        interpolation="bicubic",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        settings="train",
        source="pretrained_cfg of mobilenetv4_conv_large.e500_r256_in1k",
    )
    calib_ids = _ids("ILSVRC2012_val", N_CALIB, 1)
    held_ids = _ids("ILSVRC2012_val", N_HELDOUT, 1 + N_CALIB)
    data = DataInfo(
        data_dir="../shared/data/imagenet/val-1300",
        calib_dir="../shared/data/imagenet/calib-1000",
        class_list="../shared/data/imagenet/classes.txt",
        labelled=labelled,
        seed=0,
        skipped=[SkippedImage(id="n01530575/ILSVRC2012_val_00012044.JPEG", reason="CMYK JPEG")],
        calibration=ImageSet(
            role="calibration",
            folder="../shared/data/imagenet/calib-1000",
            labelled=labelled,
            n_images=N_CALIB,
            n_classes=500 if labelled else None,
            per_class_min=1 if labelled else None,
            per_class_max=1 if labelled else None,
            ids_sha256=_sha(calib_ids),
            ids=calib_ids,
        ),
        heldout=ImageSet(
            role="heldout",
            folder="../shared/data/imagenet/val-1300",
            labelled=labelled,
            n_images=N_HELDOUT,
            n_classes=725 if labelled else None,
            per_class_min=2 if labelled else None,
            per_class_max=3 if labelled else None,
            ids_sha256=_sha(held_ids),
            ids=held_ids,
        ),
    )
    counts = {
        "selected.conv2d.1x1": len(selected),
        "excluded.conv2d.depthwise": sum(1 for x in excluded if x.groups > 1),
        "excluded.conv2d.3x3_dense": sum(
            1 for x in excluded if x.kernel == (3, 3) and x.groups == 1
        ),
        "excluded.conv2d.head": 1,
        "excluded.linear": 1,
    }
    recipe = RecipeInfo(
        name="mobilenetv4_pw",
        source="builtin:mobilenetv4_pw",
        sha256="0d9e7a61c3b2f5e4d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5",
        description="FP8 for the 1x1 convolutions inside the blocks; stem, edge-residual 3x3, "
        "depthwise, head and classifier stay fp16.",
        format="fp8_e4m3",
        weight_granularity="per_channel",
        fold_bn=True,
        calibrator="max",
        calibrator_params={},
        selected=selected,
        excluded=excluded,
        counts=counts,
    )
    rng = np.random.default_rng(7)
    tensors = [
        TensorScale(
            tensor=f"{layer.name}:input",
            consumers=[layer.name],
            amax=float(a),
            scale=float(a) / 448.0,
        )
        for layer, a in zip(selected, rng.uniform(2.0, 40.0, len(selected)), strict=True)
    ]
    calibration = CalibrationInfo(calibrator="max", params={}, n_images=N_CALIB, tensors=tensors)
    dev = "cuda:0" if on_gpu else "cpu"
    compiled = on_gpu
    mode = "max-autotune" if on_gpu else "default"
    numerics = {"allow_tf32": "False", "matmul_precision": "highest"}

    def einfo(name, dtype, wbytes, fp8_real=(), fp8_emulated=(), fp16_layers=0):
        return EngineInfo(
            name=name,
            compute_dtype=dtype,
            device="cpu" if name.startswith(("fp32", "fakequant")) else dev,
            compiled=compiled and name in ("fp16", "fp8"),
            compile_mode=mode if compiled and name in ("fp16", "fp8") else None,
            cuda_graphs=compiled and name in ("fp16", "fp8"),
            channels_last=name in ("fp16", "fp8"),
            fp8_real=list(fp8_real),
            fp8_emulated=list(fp8_emulated),
            fp16_layers=fp16_layers,
            weight_bytes=wbytes,
            numerics=numerics,
        )

    n_layers = len(selected) + len(excluded)
    fp16_bytes = 65_175_264
    engines = [
        einfo("fp32", "float32", 2 * fp16_bytes),
        einfo("fp16", "float16", fp16_bytes, fp16_layers=n_layers),
        einfo(
            "fp8",
            "float16",
            fp8_weight_bytes,
            fp8_real=real if on_gpu else [],
            fp8_emulated=emulated if on_gpu else [x.name for x in selected],
            fp16_layers=len(excluded),
        ),
        einfo("fakequant", "float32", 2 * fp16_bytes, fp8_emulated=[x.name for x in selected]),
        einfo(
            "fakequant_weights", "float32", 2 * fp16_bytes, fp8_emulated=[x.name for x in selected]
        ),
        einfo(
            "fakequant_activations",
            "float32",
            2 * fp16_bytes,
            fp8_emulated=[x.name for x in selected],
        ),
    ]
    eq = [
        _engine_quality(name, *outcomes[name], labelled=labelled, seed=11 + i)
        for i, name in enumerate(DEFAULT_OUTCOMES)
    ]
    scans = [
        NonFiniteScan(
            engine=e.name,
            heldout_checked=N_HELDOUT,
            stress_checked=len(STRESS),
            nonfinite_heldout=[x for x in nonfinite.get(e.name, []) if x.endswith(".JPEG")],
            nonfinite_stress=[x for x in nonfinite.get(e.name, []) if not x.endswith(".JPEG")],
        )
        for e in engines
        if e.name != "fp32"
    ]
    scans.insert(
        0,
        NonFiniteScan(
            engine="fp32",
            heldout_checked=N_HELDOUT,
            stress_checked=len(STRESS),
            nonfinite_heldout=[],
            nonfinite_stress=[],
        ),
    )
    qwarn = [
        "held-out set is not class-balanced: 2 to 3 images per class over 725 classes",
    ]
    if random_weights:
        qwarn.append("random weights: top-1 against labels is not meaningful")
    quality = QualitySection(
        reference="fp32",
        engines=eq,
        emulation_gap=EmulationGap(
            agreement=1.0 - 9 / N_HELDOUT, differ_count=9, kl_mean=0.00071, kl_max=0.0412
        ),
        against_fp16=_engine_quality(
            "fp8", *(against_fp16 or outcomes["fp8"]), labelled=labelled, seed=31
        ),
        nonfinite=scans,
        stress_inputs=STRESS,
        n_classes=725 if labelled else None,
        per_class_min=2 if labelled else None,
        per_class_max=3 if labelled else None,
        warnings=qwarn,
        meaningful=not random_weights,
        meaningless_reason="random weights" if random_weights else None,
    )
    rounds = 30
    bspeeds = [_batch_speed(b, speedup[b], noise, seed=100 + b, rounds=rounds) for b in batches]
    kernels = []
    for b in (batches[0], batches[-1]):
        bs = next(x for x in bspeeds if x.batch == b)
        kernels += _kernels(b, bs.fp16_ms.median, bs.fp8_ms.median)
    speed = SpeedSection(
        device="cuda:0 (NVIDIA H200)" if on_gpu else "cpu",
        meaningful=on_gpu,
        meaningless_reason=None if on_gpu else "timed on CPU: not evidence for a GPU engine",
        compile_mode=mode,
        timed_region=(
            "with torch.cuda.graph(g):  # captured once per engine and batch\n"
            "    out = engine.module(static_input[k])  # input already fp16/NHWC on the GPU\n"
            "# timed: start.record(); for _ in range(iters): g.replay(); end.record();\n"
            "# end.synchronize(); ms = start.elapsed_time(end) / iters\n"
            "# not timed: host-to-device copy, prepare(), output .float().cpu()"
        ),
        rounds=rounds,
        iters_per_round=200,
        warmup=50,
        input_buffers=4,
        clocks={"sm_clock": "1980 MHz (locked)", "memory_clock": "3201 MHz"} if on_gpu else {},
        batches=bspeeds,
        kernels=kernels if on_gpu else [],
        weight_bytes={"fp16": fp16_bytes, "fp8": fp8_weight_bytes},
        package_bytes=None,
    )
    variants = []
    if with_variant:
        vq = _engine_quality("fp8_depthwise_too", 41, 55, 3, 0.093, labelled=labelled, seed=99)
        variants.append(
            Variant(
                name="depthwise_too",
                recipe="builtin:mobilenetv4_pw_dw",
                selected_count=len(selected) + 45,
                quality=vq,
                speed=[
                    _batch_speed(b, speedup[b] * 0.97, noise, seed=200 + b, rounds=rounds)
                    for b in batches
                ],
            )
        )
    config = StudyConfig(
        model=model.name,
        weights="random" if random_weights else "cache",
        data=data.data_dir,
        calib_data=data.calib_dir,
        recipe=recipe.source,
        calib=N_CALIB,
        heldout=N_HELDOUT,
        seed=0,
        device=device,
        batches=batches,
        compile_mode=mode,
        test_settings=False,
        policy="builtin:default",
    )
    record = StudyRecord(
        name="mobilenetv4_conv_large-fp8",
        status="partial" if partial else "complete",
        config=config,
        environment=env,
        model=model,
        preprocessing=pre,
        data=data,
        recipe=recipe,
        calibration=calibration,
        engines=engines,
        quality=None if partial else quality,
        speed=None if partial else speed,
        variants=[] if partial else variants,
        not_run=[
            "percentile, MSE and entropy calibrators",
            "per-layer sensitivity and the recipe search",
            "batch sizes other than 1, 32 and 128",
        ],
    )
    if with_decision:
        policy, label = load_policy(None)
        record = record.model_copy(update={"decision": decide(record, policy, label)})
    return record


def fixture_json(record: StudyRecord) -> str:
    return json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(fixture_json(build_record()))
    sys.stdout.write(f"wrote {FIXTURE}\n")
