"""Per-layer FP8 kernel choice: the faster of the fused Triton product and torch._scaled_mm,
timed in place while the engine is built.

Why: on the H200 our fused product beat cuBLASLt's FP8 GEMM on thin products (Lite0,
ghostnet: 0.35-0.6x its time) and lost on large-K ones (crossvit, mobilenetv4, res2net:
1.1-1.6x; docs/fp8-kernel.md, "Where FP8 still misses"). Since the fused kernel promotes its
sums every 128 products as cuBLASLt does, both compute the same bits, so the choice changes
no number, only time.

How: one forward pass of the built fused engine (eager, on the GPU, the example tiled to the
batch the choice is made for) with a pre-hook on every fused 1x1/linear layer that times, on
that layer's own input:

- fused: the layer's forward (input quantize and the fused product with scale, bias and the
  absorbed activation in its epilogue);
- scaled_mm: the unfused layer of the same plan (`FP8Matmul`: input quantize,
  torch._scaled_mm, bias, cast), then the absorbed activation as its own op.

Both start with the same input quantize, eager here (float32 divide, clamp, cast: separate
kernels) but fused into the producing kernel by the compiled engine, so its time, measured
alone on the same input, is subtracted from both: on res2net at batch 128 it was most of each
layer's eager time (docs/fp8-kernel.md). Each is replayed from a CUDA graph
(`triton.testing.do_bench_cudagraph`, median). scaled_mm replaces the fused
layer only when it is faster by more than `MARGIN` (ties keep the engine's default). Layers
with an FP8 hand-off (`quant/handoff.py`) and kxk convs have no unfused counterpart and stay
fused. Timings are cached per GPU, library versions and layer (input shape, the layer's
description, bias, weight granularity, dtype) in a JSON file in the engines' cache directory,
so a rebuilt engine reuses them.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from quantstudy.quant.apply import QuantPlan, apply_fp8, replace_module
from quantstudy.quant.fp8 import to_fp8
from quantstudy.quant.fused import FusedFP8Matmul
from quantstudy.quant.fused_conv import FusedFP8Conv2d
from quantstudy.quant.fused_dw import FusedFP8Depthwise
from quantstudy.quant.modules import bind_scaled_mm
from quantstudy.record import LayerKernel
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import Fp8Kernel

MARGIN = 0.03
"""scaled_mm must take less than (1 - MARGIN) of the fused layer's time to replace it."""

# The epilogue's activations (`quant.fused.ACTIVATIONS`) as modules, for the unfused layer.
ACT_MODULES: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "silu": nn.SiLU,
    "hardswish": nn.Hardswish,
    "gelu": nn.GELU,
}


def cache_path() -> Path:
    """Beside Inductor's cache (`engines.builders._compile` sets its directory)."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    base = Path(root).parent if root else Path.home() / ".cache" / "quantstudy"
    return base / "fp8_kernel_choice.json"


def _versions(device: torch.device) -> str:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    # the last field names how layers are timed, so entries timed another way are not reused
    return f"{gpu}|torch {torch.__version__}|triton {triton.__version__}|quantize subtracted"


def _time_us(fn: Callable[[], object]) -> float:
    import triton.testing

    fn()  # compiles and autotunes outside the graph
    torch.cuda.synchronize()
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=10, return_mode="median")


def _unfused(fp8mm: nn.Module, act: str) -> nn.Module:
    return nn.Sequential(fp8mm, ACT_MODULES[act]()) if act != "none" else fp8mm


def choose_kernels(
    model: nn.Module,
    source: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    example: torch.Tensor,
    device: torch.device,
    batch: int,
    cache: Path | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> list[LayerKernel]:
    """Time and choose every fused 1x1/linear layer of the fused engine `model` (on `device`,
    channels-last) at `batch` (the module docstring), swap the layers scaled_mm wins in place,
    and return the choice per FP8 layer. Off CUDA nothing is timed and every layer stays
    fused, unless a `timer` (a callable's time in us) is given: tests pass their own."""
    fused = {n: m for n, m in model.named_modules() if isinstance(m, FusedFP8Matmul)}
    real = [
        n
        for n in plan.layers
        if isinstance(model.get_submodule(n), (FusedFP8Matmul, FusedFP8Conv2d, FusedFP8Depthwise))
    ]
    if timer is None and device.type != "cuda":
        return [LayerKernel(name=n, kernel=Fp8Kernel.FUSED, why="not timed off CUDA") for n in real]
    alt = copy.deepcopy(source).to(dtype)
    apply_fp8(alt, source, plan, dtype, Fp8Kernel.SCALED_MM)
    alt = alt.to(device)
    bind_scaled_mm(alt, device)
    path = cache or cache_path()
    stored = json.loads(path.read_text()) if path.is_file() else {}
    versions = _versions(device)
    clock = timer or _time_us
    timed: dict[str, tuple[float, float]] = {}

    def hook(name: str, layer: FusedFP8Matmul):
        def pre(_module, args):
            x = args[0]
            if layer.fp8_input or layer.out_scale is not None:
                return
            key = json.dumps([versions, list(x.shape), layer.extra_repr(), layer.bias is not None,
                              plan.per_channel, str(dtype)])  # fmt: skip
            if key not in stored:
                other = _unfused(alt.get_submodule(name), layer.act)
                shared = clock(lambda: to_fp8(x, layer.x_scale))
                # forward, not __call__: this hook must not run again inside its own timing
                fused_us, mm_us = clock(lambda: layer.forward(x)), clock(lambda: other(x))
                stored[key] = [max(fused_us - shared, 0.0), max(mm_us - shared, 0.0)]
            timed[name] = tuple(stored[key])

        return pre

    handles = [m.register_forward_pre_hook(hook(n, m)) for n, m in fused.items()]
    try:
        x = example[:1].repeat(batch, *([1] * (example.dim() - 1)))
        x = x.to(device, dtype).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, stored)
    choices = []
    for name in real:
        if name not in timed:
            layer = model.get_submodule(name)
            why = "not run in the example pass"
            if isinstance(layer, FusedFP8Conv2d):
                why = "no unfused kernel (kxk conv)"
            elif layer.fp8_input or layer.out_scale is not None:
                why = "FP8 hand-off"
            choices.append(LayerKernel(name=name, kernel=Fp8Kernel.FUSED, why=why))
            continue
        fused_us, mm_us = timed[name]
        win = mm_us < (1 - MARGIN) * fused_us
        if win:
            replace_module(model, name, _unfused(alt.get_submodule(name), fused[name].act))
        choices.append(
            LayerKernel(
                name=name,
                kernel=Fp8Kernel.SCALED_MM if win else Fp8Kernel.FUSED,
                fused_us=fused_us,
                scaled_mm_us=mm_us,
                batch=batch,
            )
        )
    return choices
