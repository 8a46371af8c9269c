"""Per-layer FP8 kernel choice: the faster of the fused Triton product and torch._scaled_mm,
timed in place while the engine is built.

Why: the fused product beats cuBLASLt's FP8 GEMM on thin products and loses on large-K ones
(docs/fp8-kernel.md, "The per-layer kernel choice"), and which a layer is depends on its
shape and batch, so it is measured, not guessed. Since the fused kernel promotes its
sums every 128 products as cuBLASLt does, both compute the same bits, so the choice changes
no number, only time.

How: one forward pass of the built fused engine per batch the choice is made for (eager, on
the GPU, the example tiled to that batch) with a pre-hook on every fused 1x1/linear layer that
times, on that layer's own input:

- fused: the layer's forward (input quantize and the fused product with scale, bias and the
  absorbed activation in its epilogue);
- scaled_mm: the unfused layer of the same plan (`FP8Matmul`: input quantize,
  torch._scaled_mm, bias, cast), then the absorbed activation as its own op, and where the
  fused layer sums a residual (`quant/rewrites/residual.py`), that add and its activation too.

Both start with the same input quantize, eager here (float32 divide, clamp, cast: separate
kernels) but fused into the producing kernel by the compiled engine, so its time, measured
alone on the same input, is subtracted from both: it can be most of a layer's eager time and
would hide the difference between the products. Each is replayed from a CUDA graph
(`triton.testing.do_bench_cudagraph`, median). scaled_mm replaces the fused
layer only when it is faster by more than `MARGIN` (ties keep the engine's default), at every
batch it was timed at; a layer that wins at some batches only becomes a `ByBatch` pair that
runs scaled_mm at those (a batch never timed takes the choice of the nearest timed one, by
ratio; a compiled engine specializes on its static batch, so the branch costs nothing there,
while a choice made at one batch can cost time at another). Layers with an FP8 hand-off
(`quant/rewrites/handoff.py`) and kxk convs have no unfused counterpart and stay fused. Timings
are cached per GPU, library versions and layer (input shape, the layer's description, bias,
weight granularity, dtype) in a JSON file in the engines' cache directory, so a rebuilt engine
reuses them.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from quantstudy.quant.formats.fp8 import to_fp8
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import PreHook, pre_hooks
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.matmul import bind_scaled_mm
from quantstudy.quant.plan.apply import QuantPlan, apply_fp8
from quantstudy.record import LayerKernel
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import Activation, Fp8Kernel

MARGIN = 0.03
"""scaled_mm must take less than (1 - MARGIN) of the fused layer's time to replace it."""

# The epilogue's activations (`quant.layers.fused_matmul.ACTIVATIONS`) as modules, for the unfused
# layer.
ACT_MODULES: dict[str, Callable[[], nn.Module]] = {
    Activation.RELU: nn.ReLU,
    Activation.RELU6: nn.ReLU6,
    Activation.SILU: nn.SiLU,
    Activation.HARDSWISH: nn.Hardswish,
    Activation.GELU: nn.GELU,
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
    median_ms: float = triton.testing.do_bench_cudagraph(fn, rep=10, return_mode="median")
    return 1000 * median_ms


def _act_module(act: str) -> nn.Module:
    return ACT_MODULES[act]() if act != Activation.NONE else nn.Identity()


class Unfused(nn.Module):
    """The unfused layer (`FP8Matmul`) with the fused layer's epilogue as separate ops: the
    absorbed activation, then, for a residual layer, the sum and the activation after it."""

    def __init__(self, fp8mm: nn.Module, act: str, res_act: str | None) -> None:
        super().__init__()
        self.layer, self.act = fp8mm, _act_module(act)
        self.res_act = _act_module(res_act) if res_act is not None else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if (residual is None) != (self.res_act is None):
            raise ValueError("a residual layer takes its residual, and no other layer takes one")
        y = self.act(self.layer(x))
        return y if self.res_act is None else self.res_act(y + residual)


def _unfused(alt: nn.Module, name: str, fused: FusedFP8Matmul) -> Unfused:
    return Unfused(alt.get_submodule(name), fused.act, fused.res_act)


def _hands_off(layer: nn.Module) -> bool:
    """Whether a fused layer reads or writes an FP8 hand-off or writes a padded output: it has
    no unfused counterpart. (Only 1x1/linear layers write a sum's FP8 copy, `pair_scale`, or
    a padded output, `out_pad`.)"""
    pair = getattr(layer, "pair_scale", None)
    padded = getattr(layer, "out_pad", None) is not None
    return layer.fp8_input or layer.out_scale is not None or pair is not None or padded


def nearest_batch(batch: int, timed: Sequence[int]) -> int:
    """The timed batch closest to `batch` by ratio (the larger on a tie)."""
    return min(sorted(timed, reverse=True), key=lambda t: abs(math.log(batch / t)))


class ByBatch(nn.Module):
    """One FP8 layer as two equal computations, the fused product and the unfused
    torch._scaled_mm layer, and the batches at which the unfused one was timed faster."""

    def __init__(self, fused: nn.Module, scaled_mm: nn.Module, wins: set[int], timed: list[int]):
        super().__init__()
        self.fused, self.scaled_mm = fused, scaled_mm
        self.wins, self.timed = sorted(wins), sorted(timed)

    def forward(self, x: torch.Tensor, *residual: torch.Tensor) -> torch.Tensor:
        pick = nearest_batch(x.shape[0], self.timed)
        return self.scaled_mm(x, *residual) if pick in self.wins else self.fused(x, *residual)

    def extra_repr(self) -> str:
        return f"scaled_mm at batches {self.wins} of timed {self.timed}"


def choose_kernels(
    model: nn.Module,
    source: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    example: torch.Tensor,
    device: torch.device,
    batches: int | Sequence[int],
    cache: Path | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> list[LayerKernel]:
    """Time and choose every fused 1x1/linear layer of the fused engine `model` (on `device`,
    channels-last) at each of `batches` (the module docstring), swap in place the layers
    scaled_mm wins, and return the choice per FP8 layer and timed batch. Off CUDA nothing is
    timed and every layer stays fused, unless a `timer` (a callable's time in us) is given:
    tests pass their own."""
    batches = sorted({batches} if isinstance(batches, int) else set(batches))
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
    timed: dict[int, dict[str, tuple[float, float]]] = {b: {} for b in batches}

    def hook(name: str, layer: FusedFP8Matmul, batch: int) -> PreHook:
        def pre(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x, rest = args[0], args[1:]  # rest: the residual of a residual layer
            if _hands_off(layer):
                return
            key = json.dumps([versions, list(x.shape), layer.extra_repr(), layer.bias is not None,
                              plan.per_channel, str(dtype)])  # fmt: skip
            if key not in stored:
                other = _unfused(alt, name, layer)
                shared = clock(lambda: to_fp8(x, layer.x_scale))
                # forward, not __call__: this hook must not run again inside its own timing
                fused_us = clock(lambda: layer.forward(x, *rest))
                mm_us = clock(lambda: other(x, *rest))
                stored[key] = [max(fused_us - shared, 0.0), max(mm_us - shared, 0.0)]
            timed[batch][name] = tuple(stored[key])

        return pre

    for batch in batches:
        x = example[:1].repeat(batch, *([1] * (example.dim() - 1)))
        x = x.to(device, dtype).contiguous(memory_format=torch.channels_last)
        with pre_hooks(model, [(n, hook(n, m, batch)) for n, m in fused.items()]):
            with torch.no_grad():
                model(x)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, stored)
    choices = []
    for name in real:
        if name not in timed[batches[0]]:
            layer = model.get_submodule(name)
            why = "not run in the example pass"
            if isinstance(layer, FusedFP8Conv2d):
                why = "no unfused kernel (kxk conv)"
            elif getattr(layer, "out_pad", None) is not None:
                why = "writes the next conv's padded input"
            elif _hands_off(layer):
                why = "FP8 hand-off"
            choices.append(LayerKernel(name=name, kernel=Fp8Kernel.FUSED, why=why))
            continue
        wins = set()
        for batch in batches:
            fused_us, mm_us = timed[batch][name]
            win = mm_us < (1 - MARGIN) * fused_us
            if win:
                wins.add(batch)
            choices.append(
                LayerKernel(
                    name=name,
                    kernel=Fp8Kernel.SCALED_MM if win else Fp8Kernel.FUSED,
                    fused_us=fused_us,
                    scaled_mm_us=mm_us,
                    batch=batch,
                )
            )
        if wins:
            unfused = _unfused(alt, name, fused[name])
            both = wins != set(batches)
            replace_module(
                model, name, ByBatch(fused[name], unfused, wins, batches) if both else unfused
            )
    return choices
