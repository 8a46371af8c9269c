"""Kernel time per group: what the GPU spent one engine call on, from the profiler.

`profile_kernels` records ONE ordinary (not graph-replayed) call of an engine's module with
torch.profiler (CUDA activity only), keeps the kernel events of the trace (category "kernel"; memcpy
and memset are not kernels) and sums their device time per group. The groups answer the seeds'
question "why did FP8 not pay": did the FP8 matrix products get cheaper, and did the quantize and
convert work around them eat the gain?

Grouping is by kernel name only, through the ordered table `RULES` below: the first rule whose
patterns all match (and whose exclusions do not) decides; a name no rule matches is "other". Names
are searched case-insensitively. The heuristics, and what they cannot see:

- FP8 matrix products are recognised by a matrix-product token together with an FP8 type token
  (`e4m3`, `e5m2`, `f8f8`, `fp8`, `float8`), by cuBLAS "nvjet" kernels whose type code starts with
  `q` (FP8 operands: `nvjet_qqtst_...`, `nvjet_qqhsh_...`), by a dense convolution kernel with an
  FP8 type (an FP8 implicit GEMM), by Inductor's `_scaled_mm` template, or by quantstudy's own
  fused kernel (`_fp8_gemm_kernel`). A depthwise kernel with
  an FP8 type counts as depthwise.
- A non-matrix kernel with an FP8 type in its name is quantize/convert work (an eager cast to
  float8). Inductor fuses the FP8 cast into the producing elementwise kernel; with Inductor's
  default kernel names ("original_aten": the sorted aten op names) such a kernel is
  `triton_*_fused_*` with both `_to_copy` (the dtype cast) and `clamp` (the saturation to +-448
  that FP8 quantization code writes before the cast, e.g. `triton_poi_fused__to_copy_clamp_div_0`).
  That whole fused kernel then counts as quantize/convert, including the producer's own
  elementwise work fused into it. A plain `_to_copy` without `clamp` (an fp32/fp16 cast) is
  "other"; so would be a cast to FP8 written without a clamp. An Inductor reduction of `abs` and
  `amax` (a dynamic FP8 scale) also counts as quantize/convert. Inductor also names such a
  kernel after the op that consumes its output, so the input quantize of the fused FP8 layer is
  `triton_poi_fused__to_copy_clamp_div_fp8_gemm_6`: an Inductor pointwise kernel is never a
  matrix product, whatever product its name mentions (without this rule those kernels count as
  FP8 matrix products).
- Depthwise convolutions are recognised only where the library names them: PyTorch's native
  `conv_depthwise2d_*` kernels, names containing `depthwise`, and cuDNN's
  `conv2d_grouped_direct_kernel` (a direct kernel for grouped convolutions, which covers depthwise
  ones and also other grouped convolutions) and `conv2d_c1_k1_nhwc_*` (one channel in and out per
  group). A depthwise convolution that cuDNN runs as an implicit
  GEMM (`sm90_xmma_fprop_...`) or that Inductor generates as a Triton kernel carries no group
  information in its name and lands in "fp16_matmul_conv" or "other": this group is a lower bound.
- Dense matrix products and convolutions not in FP8 (fp16/bf16, or fp32 if any) are
  "fp16_matmul_conv": cuBLAS/cuBLASLt/CUTLASS GEMM and GEMV kernels, cuDNN fprop kernels, Inductor
  templates (`triton_tem_*`: mm, addmm, bmm, convolution), and fused attention kernels (flash,
  fmha, sdpa), which are matrix products too.
- "other" holds the rest: elementwise, reductions, softmax, pooling, layout changes
  (`nchwToNhwcKernel`), cuBLAS split-K reductions (`splitKreduce_kernel`), whose names do not
  say which product they finish, and Inductor pointwise/reduction kernels (`triton_poi_`,
  `triton_red_`, `triton_per_`) even when named after a convolution or matrix product whose bias
  or activation they apply (`triton_poi_fused_convolution_hardswish_0`).
A fused kernel counts once, in the first group that matches.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quantstudy.engines.base import Engine
from quantstudy.record import KernelBreakdown, KernelGroupTime
from quantstudy.record.readers import read_bytes
from quantstudy.record.vocab import KernelGroup

Group = KernelGroup
GROUPS: tuple[Group, ...] = tuple(KernelGroup)
"""Group names in report order (`record.vocab.KernelGroup`)."""

TOP_KERNELS = 8
"""How many kernel names (by summed time) a breakdown lists for the reader."""

PROFILE_WARMUP = 3
"""Ordinary calls made before the profiled call (compilation, autotuning, lazy module loads)."""

# Building blocks of the rules, kept apart so each rule reads as a sentence.
FP8_TYPE = r"e4m3|e5m2|f8f8|fp8|float8"
MATMUL = r"gemm|gemv|matmul|scaled_mm|nvjet|xmma|cutlass|tensorop|wgmma|hmma|s16816|^triton_tem_"
CONV = r"fprop|conv2d|convolution|convolve|implicit_gemm|winograd"
# `conv2d_c1_k1_nhwc_specialized`: cuDNN's NHWC kernel for one input and one output channel per
# group. Among the top kernels of the GPU profiles in docs/results it is in every model with
# depthwise convs (EfficientNet-Lite0, MobileNetV4, ghostnet, xception41) and in none without
# (crossvit, res2net); the "fp16 products" of those records hold it.
DEPTHWISE = r"depthwise|conv_depthwise|grouped_direct|conv2d_c1_k1"
ATTENTION = r"flash_fwd|flash_attn|fmha|sdpa|attention"
INDUCTOR_ELEMENTWISE = r"^triton_(poi|red|per)_"
"""Inductor pointwise/reduction kernels: named after the aten ops they absorbed, so an epilogue
such as `triton_poi_fused_convolution_hardswish_0` (bias and activation after an extern
convolution) must not count as a convolution."""


@dataclass(frozen=True)
class Rule:
    """One row of the grouping table: every `all_of` pattern matches and no `none_of` pattern."""

    group: Group
    all_of: tuple[str, ...]
    none_of: tuple[str, ...] = ()
    why: str = ""

    def matches(self, name: str) -> bool:
        return all(re.search(p, name, re.IGNORECASE) for p in self.all_of) and not any(
            re.search(p, name, re.IGNORECASE) for p in self.none_of
        )


RULES: tuple[Rule, ...] = (
    Rule(
        KernelGroup.FP8_MATMUL,
        (r"^nvjet_(sm\d+_)?q",),
        why="cuBLAS nvjet GEMM whose type code starts with q: FP8 operands (nvjet_qqtst_...)",
    ),
    Rule(
        KernelGroup.FP8_MATMUL,
        (MATMUL, FP8_TYPE),
        none_of=(INDUCTOR_ELEMENTWISE,),
        why="a GEMM/CUTLASS/xmma kernel with an FP8 type in its name "
        "(sm90_xmma_gemm_e4m3..., cutlass ...float_e4m3_t..., f8f8bf16_rowwise)",
    ),
    Rule(
        KernelGroup.FP8_MATMUL,
        (CONV, FP8_TYPE),
        none_of=(DEPTHWISE, INDUCTOR_ELEMENTWISE),
        why="a dense convolution kernel with an FP8 type: an FP8 implicit GEMM",
    ),
    Rule(
        KernelGroup.FP8_MATMUL,
        (r"^_fp8_gemm_kernel",),
        why="quantstudy's fused FP8 product (quant/kernels/gemm.py)",
    ),
    Rule(
        KernelGroup.FP8_MATMUL,
        (r"^triton_tem_.*scaled_mm",),
        why="Inductor's Triton template for _scaled_mm (max-autotune)",
    ),
    Rule(
        KernelGroup.QUANTIZE_CONVERT,
        (FP8_TYPE,),
        none_of=(r"splitKreduce", DEPTHWISE),
        why="an FP8 type in a kernel that is not a matrix product or convolution: a cast",
    ),
    Rule(
        KernelGroup.QUANTIZE_CONVERT,
        (r"^triton_\w+?_fused_\w*_to_copy", r"clamp"),
        why="Inductor kernel with a dtype cast and a clamp: the saturating cast to FP8",
    ),
    Rule(
        KernelGroup.QUANTIZE_CONVERT,
        (r"^triton_\w+?_fused_\w*abs_\w*amax",),
        why="Inductor reduction of abs and amax: a dynamic FP8 scale",
    ),
    Rule(
        KernelGroup.DEPTHWISE_CONV,
        (DEPTHWISE,),
        none_of=(INDUCTOR_ELEMENTWISE,),
        why="kernels named depthwise by PyTorch, or cuDNN's grouped direct convolution "
        "(in any dtype, FP8 included)",
    ),
    Rule(
        KernelGroup.FP16_MATMUL_CONV,
        (MATMUL,),
        none_of=(INDUCTOR_ELEMENTWISE, r"splitKreduce"),
        why="a GEMM/GEMV/CUTLASS/xmma kernel or an Inductor template, without an FP8 type",
    ),
    Rule(
        KernelGroup.FP16_MATMUL_CONV,
        (CONV,),
        none_of=(INDUCTOR_ELEMENTWISE,),
        why="a convolution kernel (cuDNN fprop, implicit GEMM, Winograd) without an FP8 type",
    ),
    Rule(
        KernelGroup.FP16_MATMUL_CONV,
        (ATTENTION,),
        none_of=(INDUCTOR_ELEMENTWISE,),
        why="a fused attention kernel: batched matrix products in fp16/bf16",
    ),
)


def group_kernel(name: str) -> Group:
    """The group of one profiler kernel name: the first matching row of `RULES`, else "other"."""
    for rule in RULES:
        if rule.matches(name):
            return rule.group
    return KernelGroup.OTHER


def kernels_from_trace(trace: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(name, duration in us) of every kernel event in a Chrome trace exported by torch.profiler.

    Kineto writes GPU kernels with category "kernel"; memcpy and memset ("gpu_memcpy",
    "gpu_memset"), runtime calls and CPU ops have other categories and are left out.
    """
    kernels = []
    for event in trace.get("traceEvents", []):
        if str(event.get("cat", "")).lower() == "kernel" and "dur" in event:
            kernels.append((str(event["name"]), float(event["dur"])))
    return kernels


def summarize_kernels(
    engine: str, batch: int, kernels: Sequence[tuple[str, float]]
) -> KernelBreakdown:
    """Per-group time and count, total, kernel count and the top kernel names of one call.

    Every group is listed, zeros included, in `GROUPS` order, so tables line up across engines.
    `top_kernels` sums the time of kernels sharing a name, largest first (ties by name).
    """
    time_us: dict[str, float] = dict.fromkeys(GROUPS, 0.0)
    count: dict[str, int] = dict.fromkeys(GROUPS, 0)
    by_name: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        group = group_kernel(name)
        time_us[group] += us
        count[group] += 1
        by_name[name] += us
    top = sorted(by_name.items(), key=lambda item: (-item[1], item[0]))[:TOP_KERNELS]
    return KernelBreakdown(
        engine=engine,
        batch=batch,
        kernel_count=len(kernels),
        total_us=float(sum(us for _, us in kernels)),
        groups=[KernelGroupTime(group=g, time_us=time_us[g], count=count[g]) for g in GROUPS],
        top_kernels=[(name, float(us)) for name, us in top],
    )


def profile_kernels(engine: Engine, x: torch.Tensor, batch: int) -> KernelBreakdown:
    """Kernel time per group of ONE ordinary call of `engine.module` on a CUDA device
    (`kernel_events`)."""
    return summarize_kernels(engine.name, batch, kernel_events(engine, x, batch))


def kernel_events(engine: Engine, x: torch.Tensor, batch: int) -> list[tuple[str, float]]:
    """(name, us) of every kernel of ONE ordinary call of `engine.module` on a CUDA device.

    `x` is a float32 NCHW batch (or one already prepared: `engine.prepare` is then a no-op). The
    module is called `PROFILE_WARMUP` times first, outside the profiler, so compilation, autotuning
    and lazy kernel loading are not in the trace. The call is not replayed from a CUDA graph, so
    kernel durations are as launched one by one; the sum of kernel times is device busy time, not
    the latency of the call (gaps between kernels are not counted).
    """
    if engine.device.type != "cuda":
        raise ValueError(f"kernel profiles need a CUDA engine; {engine.name} is on {engine.device}")
    xp = engine.prepare(x)
    with torch.no_grad():
        for _ in range(PROFILE_WARMUP):
            engine.module(xp)
        torch.cuda.synchronize(engine.device)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            engine.module(xp)
            torch.cuda.synchronize(engine.device)
    with tempfile.TemporaryDirectory(prefix="quantstudy-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        # parsed as the profiler wrote it (Kineto's JSON, not held to our files' rules)
        trace = json.loads(read_bytes(path, "json", "profiler trace"))
    kernels = kernels_from_trace(trace)
    if not kernels:
        raise RuntimeError(
            f"the profiler recorded no kernel for one call of {engine.name} at batch {batch}; "
            "is CUPTI available and the module running on the GPU?"
        )
    return kernels
