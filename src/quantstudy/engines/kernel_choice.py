"""Per-layer kernel choice: for each real FP8 layer the fastest of the fused Triton product,
every other backend this machine runs (torch._scaled_mm followed by the layer's epilogue as
separate ops; cuBLASLt with the layer's own epilogue, made from the fused layer:
`engines/candidates.py`) and, stepped aside, its float layer, timed in place while the engine
is built (the loop, step by step: docs/DESIGN.md, "The kernel-choice loop").

Why measured: the fused product beats cuBLASLt on thin products and loses on large-K ones, and
which a layer is depends on its shape and batch (docs/fp8-kernel.md). Both FP8 kernels sum as
the engine's build spec says (`record/build_spec.py`): promoting every 128 products they
write the same fp16 numbers but for rare outputs one ulp apart (docs/fp8-kernel.md, "What one
FP8 layer computes"); summing fast, each in its own order, within the accumulator's bound.
Stepping aside changes more, so it is decided for every timed batch at once
(`engines/step_aside.py`).

How: one eager forward of the fused engine per batch, a pre-hook timing each layer's sides on
its own input (`engines/layer_timing.py`). The input quantize, which the compiled engine fuses
into the producer, is timed alone and subtracted from every FP8 side. A kernel replaces another
only when faster by more than `MARGIN`; a layer that wins at some batches only runs as a
`ByBatch` pair. The engine assembled after the choice hands FP8 over between layers: a layer
whose backend takes the fused layer's state keeps its choice there (`settled`). Timings are
cached per GPU, versions, layer and the recipe's GELU policy beside the Inductor cache; a
recorded choice is rebuilt without timing (`replay_kernels`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from quantstudy.engines import layer_timing
from quantstudy.engines.candidates import Candidates
from quantstudy.engines.layer_timing import Timer
from quantstudy.engines.step_aside import MARGIN, fp16_blocker, steps_aside
from quantstudy.env.machine import device_label, torch_version, triton_version
from quantstudy.quant import backends
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import PreHook, pre_hooks
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import LayerKernel
from quantstudy.record.build_spec import DEFAULT_BACKEND, BuildSpec
from quantstudy.record.engines import FP16
from quantstudy.record.errors import UserError
from quantstudy.record.io import beside_inductor_cache, write_json_atomic
from quantstudy.record.vocab import GeluPolicy

FUSED_LAYERS = (FusedFP8Matmul, FusedFP8Conv2d, FusedFP8Depthwise)
ROUNDS, ITERS, WARMUP = 10, 10, 3
"""Rounds per layer and batch: few, since every layer is timed at every batch while the
engine is built, and the choice reads the median only."""


def cache_path() -> Path:
    """Beside Inductor's cache (`engines.builders._compile` sets its directory)."""
    return beside_inductor_cache() / "fp8_kernel_choice.json"


def _versions(device: torch.device) -> str:
    gpu = device_label(device)
    # the last field names how layers are timed, so entries timed another way are not reused
    return (
        f"{gpu}|torch {torch_version()}|triton {triton_version()}|"
        f"layer_timing rounds {ROUNDS}x{ITERS}, quantize subtracted per round, fp16, "
        "whole-state backends with the layer's epilogue"
    )


def nearest_batch(batch: int, timed: Sequence[int]) -> int:
    """The timed batch closest to `batch` by ratio (the larger on a tie)."""
    return min(sorted(timed, reverse=True), key=lambda t: abs(math.log(batch / t)))


class ByBatch(nn.Module):
    """One FP8 layer as equal computations on several backends (`modules`, by name) and the
    backend each timed batch chose (`picks`): a call runs the one its nearest timed batch chose."""

    def __init__(self, modules: dict[str, nn.Module], picks: dict[int, str]):
        super().__init__()
        self.backends = nn.ModuleDict(modules)
        self.picks = dict(sorted(picks.items()))

    def forward(self, x: torch.Tensor, *residual: torch.Tensor) -> torch.Tensor:
        pick = self.picks[nearest_batch(x.shape[0], list(self.picks))]
        return self.backends[pick](x, *residual)

    def extra_repr(self) -> str:
        return f"by timed batch: {self.picks}"


@dataclass(frozen=True)
class Timing:
    """One layer's in-place times at one batch, in us, by backend name and "fp16" (its float
    layer), the shared input quantize subtracted from the FP8 sides; a name absent: not timed
    (no such kernel for the layer). The base backend (`DEFAULT_BACKEND`, which the engine is
    assembled with) is always timed."""

    us: dict[str, float]

    def to_json(self) -> dict[str, float]:
        """The cache's entry: each time under its name."""
        return dict(self.us)

    @classmethod
    def of_json(cls, entry: dict[str, float | None]) -> Timing:
        if entry.get(DEFAULT_BACKEND) is None:
            raise ValueError("a timed layer has its base backend's time")
        return cls({k: v for k, v in entry.items() if v is not None})

    @property
    def fp16(self) -> float | None:
        return self.us.get(FP16)

    def fp8(self) -> tuple[str, float]:
        """The fastest FP8 backend and its time: another than the base one only where faster
        than it by `MARGIN` (ties and noise keep the engine as assembled)."""
        base = self.us[DEFAULT_BACKEND]
        name, us = min(((n, t) for n, t in self.us.items() if n != FP16), key=lambda p: p[1])
        if name != DEFAULT_BACKEND and us < (1 - MARGIN) * base:
            return name, us
        return DEFAULT_BACKEND, base


def layer_rows(name: str, timings: dict[int, Timing]) -> list[LayerKernel]:
    """The choice for one timed layer, one row per batch: "fp16" at every batch where it
    steps aside (`step_aside.steps_aside`), else the fastest FP8 backend at each, one for all
    where the picks would compute the epilogue two ways (`_one_arithmetic`)."""
    batches = sorted(timings)
    picks = _one_arithmetic({b: timings[b].fp8() for b in batches}, timings)
    aside = steps_aside([timings[b].fp16 for b in batches], [picks[b][1] for b in batches])
    return [
        LayerKernel(name=name, kernel=FP16 if aside else picks[b][0], us=timings[b].us, batch=b)
        for b in batches
    ]


def apply_choice(candidates: Candidates, choice: list[LayerKernel]) -> None:
    """Swap in place the layers of `candidates.model` whose rows choose another module than the
    fused layer: the float layer where every row says "fp16", another backend's layer where
    every row names it, a `ByBatch` where the rows differ."""
    model = candidates.model
    rows: dict[str, dict[int, str]] = {}
    for c in choice:
        if c.batch is not None:
            rows.setdefault(c.name, {})[c.batch] = c.kernel
    for name, kernels in rows.items():
        fused = model.get_submodule(name)
        kinds = set(kernels.values())
        if FP16 in kinds:
            if kinds != {FP16}:
                raise ValueError(f"{name}: a layer steps aside at every timed batch or at none")
            blocker = fp16_blocker(fused)
            if blocker is not None:
                raise UserError(
                    f"{name} was kept in fp16, but in the engine this quantstudy builds it "
                    f"cannot be ({blocker}); run the study again"
                )
            replace_module(model, name, candidates.get(name, FP16, fused))
            continue
        if kinds == {DEFAULT_BACKEND}:
            continue
        modules = {
            k: fused if k == DEFAULT_BACKEND else candidates.get(name, k, fused)
            for k in sorted(kinds)
        }
        new = modules[kinds.pop()] if len(kinds) == 1 else ByBatch(modules, kernels)
        replace_module(model, name, new)


def _untimed_why(layer: nn.Module) -> str:
    blocker = fp16_blocker(layer)
    return blocker if blocker is not None else "not run in the example pass"


def choose_kernels(
    model: nn.Module,
    source: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    example: torch.Tensor,
    device: torch.device,
    batches: int | Sequence[int],
    cache: Path | None = None,
    timer: Timer | None = None,
    *,
    plain: nn.Module | None = None,
    spec: BuildSpec | None = None,
) -> list[LayerKernel]:
    """Time and choose every real FP8 layer of the fused engine `model` (on `device`,
    channels-last) at each of `batches` (the module docstring), swap in place the layers another
    kernel wins, and return the choice per FP8 layer and timed batch. `plain` is the float32
    model the fp16 engine is built from (default `source`, the same where the plan corrects or
    fits no bias). `timer`: a callable's time in us (a stand-in clock); None: on CUDA the
    interleaved rounds of `layer_timing.time_layer`, elsewhere nothing is timed and every layer
    stays fused. `spec`: the engine's build spec (default `BuildSpec()`), which every candidate
    is built with and the cache keys on."""
    batches = sorted({batches} if isinstance(batches, int) else set(batches))
    fused = {n: m for n, m in model.named_modules() if isinstance(m, FUSED_LAYERS)}
    real = [n for n in plan.layers if isinstance(model.get_submodule(n), FUSED_LAYERS)]
    if timer is None and device.type != "cuda":
        return [LayerKernel(name=n, kernel=DEFAULT_BACKEND, why="not timed off CUDA") for n in real]
    plain = plain if plain is not None else source
    options = Candidates(model, source, plain, plan, dtype, device, spec or BuildSpec())
    timed = _time_layers(options, fused, example, batches, cache or cache_path(), timer)
    choice = []
    for name in real:
        if name in timed:
            choice += layer_rows(name, timed[name])
        else:
            why = _untimed_why(model.get_submodule(name))
            choice.append(LayerKernel(name=name, kernel=DEFAULT_BACKEND, why=why))
    apply_choice(options, choice)
    return choice


def _time_layers(
    options: Candidates,
    fused: dict[str, nn.Module],
    example: torch.Tensor,
    batches: list[int],
    path: Path,
    clock: Timer | None,
) -> dict[str, dict[int, Timing]]:
    """layer -> batch -> its times, from one eager pass of the engine per batch with a
    pre-hook on each layer that may take another kernel; cached in the JSON file `path`."""
    stored = json.loads(path.read_text()) if path.is_file() else {}
    versions = _versions(options.device)
    timed: dict[str, dict[int, Timing]] = {}

    def hook(name: str, layer: nn.Module, batch: int) -> PreHook:
        def pre(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x, rest = args[0], args[1:]  # rest: the residual of a residual layer
            key = json.dumps([versions, list(x.shape), layer.extra_repr(), layer.bias is not None,
                              options.plan.per_channel, str(options.dtype),
                              str(options.plan.gelu), options.spec.key()])  # fmt: skip
            if key not in stored:
                # forward, not __call__: this hook must not run again inside its own timing
                fp8: dict[str, Callable[..., object]] = {DEFAULT_BACKEND: layer.forward}
                for other in options.others(name, layer):
                    fp8[other] = options.get(name, other, layer)
                half = options.get(name, FP16, layer)
                # the real input, captured in place; the quantize subtracted: in the engine the
                # producer's epilogue does it (module docstring)
                t = layer_timing.time_layer(
                    half, fp8, (x, *rest), quantize_scale=layer.x_scale, rounds=ROUNDS,
                    iters=ITERS, warmup=WARMUP, device=options.device, timer=clock,
                )  # fmt: skip
                us = {k: t.median(k) for k in (*fp8, FP16)}
                stored[key] = Timing({k: v for k, v in us.items() if v is not None}).to_json()
            timed.setdefault(name, {})[batch] = Timing.of_json(stored[key])

        return pre

    for batch in batches:
        x = example[:1].repeat(batch, *([1] * (example.dim() - 1)))
        x = x.to(options.device, options.dtype).contiguous(memory_format=torch.channels_last)
        hooks = [(n, hook(n, m, batch)) for n, m in fused.items() if fp16_blocker(m) is None]
        with pre_hooks(options.model, hooks), torch.no_grad():
            options.model(x)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, stored)
    return {n: t for n, t in timed.items() if set(t) == set(batches)}


def _one_arithmetic(
    picks: dict[int, tuple[str, float]], timings: dict[int, Timing]
) -> dict[int, tuple[str, float]]:
    """The picks of a layer whose fastest backend differs between batches, made one where a
    pick computes the epilogue its own way (`Backend.takes_fused`: cuBLASLt's tanh GELU, its
    folded alpha): every batch then runs the backend of least summed time among those timed at
    every batch (another than the base one only where faster than it by `MARGIN`, as at one
    batch), so the layer's record (its GELU form, `FP8Layout.gelu`) and its emulation hold at
    whichever batch it runs."""
    kernels = {k for k, _ in picks.values()}
    if len(kernels) < 2 or not any(_takes_fused(k) for k in kernels):
        return picks

    def total(kernel: str) -> float:
        return sum(t.us[kernel] for t in timings.values())

    everywhere = [k for k in sorted(kernels) if all(k in t.us for t in timings.values())]
    best = min(everywhere, key=total)
    if total(best) >= (1 - MARGIN) * total(DEFAULT_BACKEND):
        best = DEFAULT_BACKEND
    return {b: (best, timings[b].us[best]) for b in picks}


def _takes_fused(kernel: str) -> bool:
    """Whether `kernel` names a backend whose layer is made from the fused layer's whole state,
    hand-offs included (`Backend.takes_fused`)."""
    return kernel not in (DEFAULT_BACKEND, FP16) and backends.get(kernel).takes_fused


def settled(choice: list[LayerKernel], model: nn.Module, gelu: GeluPolicy) -> list[LayerKernel]:
    """A choice timed where no layer hands off (`engines/fp8_assembly.py`), as the engine `model`
    assembled after it runs it: a layer that hands off there keeps its timings, with why, and
    runs fused, but where its backend takes the fused layer's state and runs its own kernel
    with the hand-off under the recipe's `gelu` (`Backend.runs_own_kernel`: cuBLASLt writing the
    next layer's FP8 input, or reading its own); the others, and rows not timed, stay."""
    out = []
    for c in choice:
        layer = model.get_submodule(c.name)
        blocker = fp16_blocker(layer) if isinstance(layer, FUSED_LAYERS) else None
        if blocker is None or c.batch is None:
            out.append(c)
        elif _takes_fused(c.kernel) and backends.get(c.kernel).runs_own_kernel(layer, gelu):
            why = f"{blocker}: runs {c.kernel} with it (timed alone, without it)"
            out.append(c.model_copy(update={"why": why}))
        else:
            why = f"{blocker}: runs fused (timed alone, without it)"
            out.append(c.model_copy(update={"kernel": DEFAULT_BACKEND, "why": why}))
    return out


def scaled_mm_pairs(choice: list[LayerKernel], handoff: dict[str, str]) -> dict[str, str]:
    """The hand-offs (producer -> reader) an engine gives up: both layers chose a backend built
    from the float layer (torch._scaled_mm) at every timed batch, timed where no layer hands
    off. Kept, the hand-off would run both on the fused kernel (`settled`); given up, each runs
    cuBLASLt's product, and the pass the hand-off saved, the reader's input quantize, follows
    the producer's activation, where Inductor can fuse the two (torchao's layout, with
    per-channel weight scales). A backend that takes the fused layer's state (cuBLASLt's layer)
    keeps the hand-off and runs with it (`settled`)."""
    kernels: dict[str, set[str]] = {}
    for c in choice:
        if c.batch is not None:
            kernels.setdefault(c.name, set()).add(c.kernel)
    # one backend built from the float layer at every timed batch (not the base one, not fp16)
    scaled = {
        n for n, k in kernels.items()
        if len(k) == 1 and not k & {DEFAULT_BACKEND, FP16} and not _takes_fused(next(iter(k)))
    }  # fmt: skip
    given = {p: c for p, c in handoff.items() if p in scaled and c in scaled}
    while True:  # a layer still tied by a kept hand-off (a chain's next link) runs fused
        tied = {n for p, c in handoff.items() if p not in given for n in (p, c)}
        kept = {p: c for p, c in given.items() if p not in tied and c not in tied}
        if kept == given:
            return given
        given = kept


def replay_kernels(
    model: nn.Module,
    source: nn.Module,
    plain: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    device: torch.device,
    choice: list[LayerKernel],
    spec: BuildSpec | None = None,
) -> list[LayerKernel]:
    """The fused engine `model` rebuilt as a recorded `choice` made it (nothing timed), so a
    study extended later computes what its engine computed (`spec`: its build spec); returns
    `choice`."""
    real = {n for n in plan.layers if isinstance(model.get_submodule(n), FUSED_LAYERS)}
    unknown = sorted({c.name for c in choice} - real)
    if unknown:
        raise UserError(
            f"the recorded FP8 kernel choice names layers this engine has no FP8 layer for "
            f"({unknown[:3]}); run the study again"
        )
    apply_choice(Candidates(model, source, plain, plan, dtype, device, spec or BuildSpec()), choice)
    return list(choice)
