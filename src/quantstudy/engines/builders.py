"""The four engines of a study: fp32 reference, fp16, FP8, and the fp32 fake-quant emulation.

Each builder copies the loaded fp32 model, so engines never share mutable state. On CUDA the fp16
and FP8 engines are compiled with Inductor (`torch.compile`, static shapes); the timing harness
captures them in CUDA graphs. On CPU they run eagerly, with bf16 in place of fp16.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantstudy.engines.base import Engine, in_memory_format
from quantstudy.engines.fp8_assembly import FP8Assembler, FP8Options
from quantstudy.engines.kernel_choice import Timer, choose_kernels, replay_kernels, settled
from quantstudy.engines.size import weight_bytes
from quantstudy.engines.step_aside import step_aside
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant.fitting.bias_correction import correct_biases, set_biases
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.matmul import scaled_mm_output_of
from quantstudy.quant.plan.apply import Applied, QuantPlan, apply_fake_quant
from quantstudy.quant.rewrites.fold import fold_batchnorm
from quantstudy.record import EngineInfo, LayerKernel
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL
from quantstudy.record.vocab import ChosenKernel, CompileMode, FP8Kernel
from quantstudy.record.vocab import Engine as EngineName


def numerics() -> dict[str, str]:
    """The global numeric settings an engine ran under, for the record."""
    return {
        "cuda.matmul.allow_tf32": str(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": str(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.benchmark": str(torch.backends.cudnn.benchmark),
    }


def set_numerics() -> None:
    """Explicit numerics for every study: no TF32 (the fp32 reference must be fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True


def half_dtype(device: torch.device) -> torch.dtype:
    """fp16 where the device has fast fp16 kernels (CUDA), bf16 on CPU."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def count_float_layers(model: nn.Module) -> int:
    return sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())


@dataclass
class BuiltEngine(Engine):
    """An engine assembled by one of the builders below."""

    name: str
    device: torch.device
    dtype: torch.dtype
    channels_last: bool
    module: Callable[[torch.Tensor], torch.Tensor]
    eager: nn.Module
    compiled: bool
    compile_mode: str | None
    applied: Applied = field(default_factory=lambda: Applied([], []))
    float_layers: int = 0
    fp8_kernel: FP8Kernel | None = None
    fp8_epilogue: dict[str, str] = field(default_factory=dict)
    fp8_handoff: dict[str, str] = field(default_factory=dict)
    fp8_residual: dict[str, str] = field(default_factory=dict)
    fp8_sum_handoff: dict[str, str] = field(default_factory=dict)
    fp8_padded_output: dict[str, str] = field(default_factory=dict)
    fp8_kernel_choice: list[LayerKernel] | None = None
    fp8_stepped_aside: list[str] = field(default_factory=list)
    fp8_rewrites_skipped: dict[str, str] = field(default_factory=dict)

    def eagerly(self) -> BuiltEngine:
        """This engine run through its eager module: a quality pass that needs no compile."""
        return dataclasses.replace(self, module=self.eager, compiled=False)

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            compute_dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
            compiled=self.compiled,
            compile_mode=self.compile_mode,
            # The engine captures no graph itself; the timing harness does (SpeedSection).
            cuda_graphs=False,
            channels_last=self.channels_last,
            fp8_real=list(self.applied.real),
            fp8_emulated=[name for name, _ in self.applied.emulated],
            fp8_kernel=self.fp8_kernel if self.applied.real else None,
            fp8_epilogue=dict(self.fp8_epilogue),
            fp8_handoff=dict(self.fp8_handoff),
            fp8_residual=dict(self.fp8_residual),
            fp8_sum_handoff=dict(self.fp8_sum_handoff),
            fp8_padded_output=dict(self.fp8_padded_output),
            fp8_scaled_mm_output=scaled_mm_output_of(self.eager),
            fp8_kernel_choice=self.fp8_kernel_choice,
            fp8_stepped_aside=list(self.fp8_stepped_aside),
            fp8_rewrites_skipped=dict(self.fp8_rewrites_skipped),
            fp16_layers=self.float_layers,
            weight_bytes=weight_bytes(self.eager),
            numerics=numerics(),
        )


# Dynamo keeps its compiled entries per code object: every engine of a model shares timm's
# `forward`, so engines x batch sizes x the scoring batch pass dynamo's default limit of 8, and
# past it dynamo runs the frame eagerly without failing, so a study would time eager engines
# without saying so. A study compiles a few dozen entries at most.
RECOMPILE_LIMIT = 256


def allow_recompiles() -> None:
    """Raise dynamo's recompile limits to `RECOMPILE_LIMIT`; hitting one is then an error."""
    cfg = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, max(getattr(cfg, key), RECOMPILE_LIMIT))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def _compile(
    module: nn.Module, device: torch.device, mode: str
) -> tuple[Callable[[torch.Tensor], torch.Tensor], bool]:
    if device.type != "cuda":
        return module, False
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "quantstudy" / "inductor")
    )
    allow_recompiles()
    compiled = torch.compile(
        module, mode=CompileMode(mode).torch_mode, dynamic=False, fullgraph=False
    )
    return compiled, True


def _compiled_engine(
    name: str,
    m: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    compile_mode: str,
    **extra: Any,
) -> BuiltEngine:
    """A channels-last engine around `m`, compiled on CUDA, eager elsewhere."""
    fn, compiled = _compile(m, device, compile_mode)
    return BuiltEngine(
        name, device, dtype, True, fn, m, compiled, compile_mode if compiled else None, **extra
    )


def build_compiled(
    name: str,
    module: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    compile_mode: str,
    **extra: Any,
) -> BuiltEngine:
    """An engine around a module made elsewhere (another library's quantized copy of
    `deployed_copy`, channels-last in `dtype` on `device`), compiled as the study's engines
    are, so that a benchmark times it beside them on equal terms."""
    return _compiled_engine(name, module, device, dtype, compile_mode, **extra)


def build_fp32(model: nn.Module, device: torch.device) -> BuiltEngine:
    """The reference: the original model, eager, float32, BatchNorm unfolded."""
    m = copy.deepcopy(model).eval().to(device)
    n = count_float_layers(m)
    return BuiltEngine(
        EngineName.FP32, device, torch.float32, False, m, m, False, None, float_layers=n
    )


def deployed_copy(
    model: nn.Module, example: torch.Tensor, fold: bool, corrected: QuantPlan | None = None
) -> nn.Module:
    """A float32 copy, BatchNorm folded when asked, biases corrected for `corrected`'s FP8
    weights when its recipe asks (`quant/fitting/bias_correction.py`), or set as fitted sequentially
    (`quant/fitting/propagated.py`)."""
    m = copy.deepcopy(model).eval()
    if fold:
        fold_batchnorm(m, example)
    if corrected is not None and corrected.fitted is not None:
        corrected.stored_weights(m)  # refuses a fit of another model
        set_biases(m, corrected.fitted.biases)
    elif corrected is not None and corrected.bias_correction:
        c = corrected
        weights = c.stored_weights(m)
        correct_biases(m, c.layers, c.calibration, c.per_channel, weights, c.divisors)
    return m


def build_half(
    model: nn.Module,
    device: torch.device,
    example: torch.Tensor,
    *,
    fold: bool = True,
    compile_mode: str = "default",
    dtype: torch.dtype | None = None,
) -> BuiltEngine:
    """The fp16 engine: BatchNorm folded, whole model in fp16 (bf16 on CPU), channels-last.

    It keeps the name "fp16" whatever `dtype` is; `EngineInfo.compute_dtype` says what ran.
    """
    dtype = dtype or half_dtype(device)
    m = drop_eval_caches(deployed_copy(model, example, fold).to(device, dtype))
    m = in_memory_format(m, torch.channels_last)
    return _compiled_engine(
        EngineName.FP16, m, device, dtype, compile_mode, float_layers=count_float_layers(m)
    )


def build_fp8(
    model: nn.Module,
    device: torch.device,
    example: torch.Tensor,
    plan: QuantPlan,
    *,
    fold: bool = True,
    compile_mode: str = "default",
    dtype: torch.dtype | None = None,
    kernel: FP8Kernel = DEFAULT_FP8_KERNEL,
    choice_batches: Sequence[int] = (128,),
    residual: bool = True,
    sum_handoff: bool = False,
    pad_outputs: bool = True,
    replay: list[LayerKernel] | None = None,
    stepped_aside: Sequence[str] = (),
    timer: Timer | None = None,
) -> BuiltEngine:
    """The FP8 engine: the fp16 engine with the plan's layers replaced by FP8 modules.

    `kernel` "fused" (default): each real FP8 layer is one fused product that also applies the
    activation that consumes it (`quant/rewrites/absorb.py` finds and checks those); "scaled_mm":
    the unfused `torch._scaled_mm` layer, kept for comparison (benchmarks run both); "fastest": the
    fused engine with each layer timed in place at each of `choice_batches` (the batches the
    engine will run) against the unfused one, and the faster kept per batch
    (`engines/kernel_choice.py`). With `residual` (default) fused 1x1/linear layers that feed a
    residual sum also compute it (`quant/rewrites/residual.py`); False keeps the add a separate
    pass (benchmarks run both). With `sum_handoff` too, where the next fused layer reads such a
    sum, the epilogue also writes that layer's FP8 input (`quant/rewrites/sum_handoff.py`): off
    by default, the second output costs the product its tile shape (docs/fp8-kernel.md). With
    `pad_outputs` (default) a fused 1x1 conv whose output only a zero-padding conv reads writes
    it padded, and that conv pads no more (`quant/rewrites/pad_handoff.py`); False keeps the pad
    a pass (benchmarks run both).

    "fastest" also keeps a layer in the engine's dtype where its float layer beat both FP8
    kernels at every batch (`engines/step_aside.py`): its layers are timed (by `timer`, tests
    pass their own) in an assembly where none hands off, then the engine is assembled and the
    choice applied. `replay`, with "fastest": a choice a study recorded, rebuilt without timing;
    `stepped_aside`, with "fused": the layers a "fastest" engine kept in fp16, run here as it ran
    them (the FP8 engine in float32 beside its emulation).
    """
    dtype = dtype or half_dtype(device)
    source = deployed_copy(model, example, fold, plan)
    options = FP8Options(residual, sum_handoff, pad_outputs)
    parts = FP8Assembler(source, plan, dtype, device, example, FP8Kernel(kernel).built, options)
    plain = None
    if kernel == FP8Kernel.FASTEST or stepped_aside:
        plain = deployed_copy(model, example, fold)  # the fp16 engine's layers, for those aside
    if kernel == FP8Kernel.FASTEST and replay is None:
        # timed where no layer hands off, so any may step aside (`engines/fp8_assembly.py`)
        screen = parts.assemble(handoffs=False).model
        replay = choose_kernels(
            screen, source, plan, dtype, example, device, choice_batches, timer=timer, plain=plain
        )
    aside = set(stepped_aside) | set(_stepped(replay or []))
    fp8 = parts.assemble(aside=aside)
    m = fp8.model
    chosen = None
    if stepped_aside:
        if kernel != FP8Kernel.FUSED:
            raise ValueError("layers step aside by name only in a fused engine")
        step_aside(m, plain, stepped_aside, dtype, device)
    elif kernel == FP8Kernel.FASTEST and replay is not None:
        chosen = replay_kernels(m, source, plain, plan, dtype, device, settled(replay, m))
    aside_list = _stepped(chosen) if chosen is not None else list(stepped_aside)
    return _compiled_engine(
        EngineName.FP8,
        m,
        device,
        dtype,
        compile_mode,
        applied=Applied([n for n in fp8.applied.real if n not in aside], fp8.applied.emulated),
        float_layers=count_float_layers(model) - len(plan.layers) + len(aside_list),
        fp8_kernel=kernel,
        fp8_epilogue={k: v for k, v in fp8.epilogue.items() if k not in aside},
        fp8_handoff=fp8.handoff,
        fp8_residual={layer: site.act for layer, site in fp8.sites.items() if layer not in aside},
        fp8_sum_handoff={layer: pair.reader for layer, pair in fp8.sum_handoff.items()},
        fp8_padded_output=fp8.padded,
        fp8_kernel_choice=chosen,
        fp8_stepped_aside=aside_list,
        fp8_rewrites_skipped=fp8.skipped,
    )


def _stepped(choice: list[LayerKernel]) -> list[str]:
    """The layers a kernel choice keeps in the engine's dtype, in its order."""
    return list(dict.fromkeys(c.name for c in choice if c.kernel == ChosenKernel.FP16))


def build_fakequant(
    model: nn.Module,
    device: torch.device,
    example: torch.Tensor,
    plan: QuantPlan,
    *,
    fold: bool = True,
    weights: bool = True,
    activations: bool = True,
    name: str = EngineName.FAKEQUANT,
    stepped_aside: Sequence[str] = (),
) -> BuiltEngine:
    """The recipe emulated in fp32, eager: same quantization points as the FP8 engine.

    Bias correction follows the weights: an activation-only run keeps float weights, so it has
    no rounding shift to correct. `stepped_aside`: the layers the FP8 engine this emulates kept
    in its compute dtype (`engines/step_aside.py`), left here as the fp16 engine's float32
    layers, as that engine ran them, so the two compare like with like.
    """
    m = deployed_copy(model, example, fold, plan if weights else None)
    applied = apply_fake_quant(m, plan, weights=weights, activations=activations)
    if stepped_aside:
        plain = deployed_copy(model, example, fold)
        for layer in stepped_aside:
            replace_module(m, layer, plain.get_submodule(layer))
        kept = set(stepped_aside)
        applied = Applied(applied.real, [(n, why) for n, why in applied.emulated if n not in kept])
    m = m.to(device)
    return BuiltEngine(
        name,
        device,
        torch.float32,
        False,
        m,
        m,
        False,
        None,
        applied=applied,
        float_layers=count_float_layers(model) - len(plan.layers) + len(stepped_aside),
    )
