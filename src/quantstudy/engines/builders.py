"""The four engines of a study: fp32 reference, fp16, FP8, and the fp32 fake-quant emulation.

Each builder copies the loaded fp32 model, so engines never share mutable state. On CUDA the fp16
and FP8 engines are compiled with Inductor (`torch.compile`, static shapes); the timing harness
captures them in CUDA graphs. On CPU they run eagerly, with bf16 in place of fp16.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantstudy.engines.base import Engine, in_memory_format
from quantstudy.engines.fp8_assembly import FP8Assembler, FP8Assembly
from quantstudy.engines.kernel_choice import (
    choose_kernels,
    replay_kernels,
    scaled_mm_pairs,
    settled,
)
from quantstudy.engines.layer_timing import Timer
from quantstudy.engines.size import weight_bytes
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant import backends
from quantstudy.quant.fitting.bias_correction import correct_biases, set_biases
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.gelu import gelu_forms
from quantstudy.quant.plan.apply import Applied, QuantPlan, apply_fake_quant, emulate_tanh_gelu
from quantstudy.quant.rewrites.fold import fold_batchnorm
from quantstudy.record import EngineInfo, FP8Layout, KernelChoice, LayerKernel
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.engines import stepped_aside
from quantstudy.record.vocab import CompileMode
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
    layout: FP8Layout = field(default_factory=FP8Layout)  # how `build_fp8` built it

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
            layout=self.layout,
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
    weights when its recipe asks (`quant/fitting/bias_correction.py`), or set by the propagated
    fit (`quant/fitting/propagated.py`)."""
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
    spec: BuildSpec | None = None,
    timer: Timer | None = None,
) -> BuiltEngine:
    """The FP8 engine: the fp16 engine with the plan's layers replaced by FP8 modules; its
    `layout` says how (`record/engines.py: FP8Layout`). `spec` (`record/build_spec.py`; default
    `BuildSpec()`: fused, fast accumulation, no lab switch) says what it computes: its kernel,
    how its products sum (every FP8 layer is built with `spec.promote`) and its rewrites.

    `spec.kernel` "fused" (default): each real FP8 layer is one fused product that also applies
    the activation that consumes it (`quant/rewrites/absorb.py` finds and checks those);
    "scaled_mm": the unfused `torch._scaled_mm` layer, kept for comparison (benchmarks run both);
    "fastest" with a `KernelChoice`: the fused engine with each layer timed in place at the
    choice's batches (the batches the engine will run) against the unfused one and its float
    layer, or replayed from a recorded choice (`engines/kernel_choice.py`), the faster FP8 kernel
    kept per batch and the float layer where it beat both at every batch
    (`engines/step_aside.py`). With `spec.residual` (default) fused 1x1/linear layers that feed a
    residual sum also compute it (`quant/rewrites/residual.py`); False keeps the add a separate
    pass (benchmarks run both). With `spec.sum_handoff` too, where the next fused layer reads
    such a sum, the epilogue also writes that layer's FP8 input (`quant/rewrites/sum_handoff.py`):
    off by default, the second output costs the product its tile shape (docs/fp8-kernel.md). With
    `spec.pad_outputs` (default) a fused 1x1 conv whose output only a zero-padding conv reads
    writes it padded, and that conv pads no more (`quant/rewrites/pad_handoff.py`); False keeps
    the pad a pass (benchmarks run both). `timer` times the layers of a timed choice
    (`kernel_choice.choose_kernels`: None, on CUDA its interleaved rounds).
    """
    dtype = dtype or half_dtype(device)
    spec = spec or BuildSpec()
    source = deployed_copy(model, example, fold, plan)
    chosen = spec.choice
    built = spec.backend
    parts = FP8Assembler(source, plan, dtype, device, example, spec)
    rows: list[LayerKernel] | None = None
    if chosen is None:
        fp8 = parts.assemble()
    else:  # the fp16 engine's layers, for those kept in fp16
        fp8, rows = _assemble_chosen(parts, chosen, deployed_copy(model, example, fold), timer)
    aside = set(stepped_aside(rows or []))
    m = fp8.model
    real = [n for n in fp8.applied.real if n not in aside]
    epilogue = {k: v for k, v in fp8.epilogue.items() if k not in aside}
    layout = FP8Layout(
        kernel=built if real else None,
        epilogue=epilogue,
        handoff=fp8.handoff,
        residual={layer: site.act for layer, site in fp8.sites.items() if layer not in aside},
        sum_handoff={layer: pair.reader for layer, pair in fp8.sum_handoff.items()},
        padded_output=fp8.padded,
        scaled_mm_output=output_notes(m),
        kernel_choice=rows,
        stepped_aside=stepped_aside(rows or []),
        rewrites_skipped=fp8.skipped,
        gelu=gelu_forms(m, epilogue),
    )
    return _compiled_engine(
        EngineName.FP8,
        m,
        device,
        dtype,
        compile_mode,
        applied=Applied(real, fp8.applied.emulated),
        float_layers=count_float_layers(model) - len(plan.layers) + len(layout.stepped_aside),
        layout=layout,
    )


def output_notes(model: nn.Module) -> str | None:
    """What the backends' layers of `model` write, where a backend has something to say
    (`Backend.output_note`; torch._scaled_mm's output dtype and bias)."""
    notes = [n for b in backends.names() if (n := backends.get(b).output_note(model))]
    return "; ".join(notes) or None


def _assemble_chosen(
    parts: FP8Assembler, choice: KernelChoice, plain: nn.Module, timer: Timer | None
) -> tuple[FP8Assembly, list[LayerKernel]]:
    """The fused engine with `choice` applied, and the choice as it runs there. A timed choice
    is timed where no layer hands off, so any may step aside (`engines/fp8_assembly.py`); the
    engine is then assembled with hand-offs among the layers that stay FP8 only."""
    p = parts
    if choice.replay is not None:
        rows = list(choice.replay)
    else:
        screen = p.assemble(handoffs=False).model
        rows = choose_kernels(
            screen, p.source, p.plan, p.dtype, p.example, p.device, choice.batches,
            timer=timer, plain=plain, spec=p.spec,
        )  # fmt: skip
    aside = set(stepped_aside(rows))
    fp8 = p.assemble(aside=aside)
    given_up = scaled_mm_pairs(rows, fp8.handoff)
    if given_up:  # assembled again without those hand-offs, so both layers can take scaled_mm
        fp8 = p.assemble(aside=aside, unlinked=set(given_up))
        readers = {c: p_ for p_, c in given_up.items()}
        rows = [_given_up(r, given_up, readers) for r in rows]
    m = fp8.model
    rows = settled(rows, m, p.plan.gelu)
    return fp8, replay_kernels(m, p.source, plain, p.plan, p.dtype, p.device, rows, p.spec)


def _given_up(row: LayerKernel, producers: dict[str, str], readers: dict[str, str]) -> LayerKernel:
    """`row` with why its layer runs scaled_mm where an FP8 hand-off was given up for it."""
    if row.name in producers:
        why = f"writes {producers[row.name]}'s input in fp16, not FP8: both run scaled_mm faster"
    elif row.name in readers:
        why = f"reads {readers[row.name]}'s output in fp16, not FP8: both run scaled_mm faster"
    else:
        return row
    return row.model_copy(update={"why": why})


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
    like: FP8Layout | None = None,
) -> BuiltEngine:
    """The recipe emulated in fp32, eager: same quantization points as the FP8 engine.

    Bias correction follows the weights: an activation-only run keeps float weights, so it has
    no rounding shift to correct. `like`: the layout of the FP8 engine this emulates; the layers
    it kept in its compute dtype (`engines/step_aside.py`) are left here as the fp16 engine's
    float32 layers, as that engine ran them, and the layers whose GELU it ran in the tanh form
    (`FP8Layout.gelu`, cuBLASLt's epilogue) are followed by that form here, so the two compare
    like with like.
    """
    aside = like.stepped_aside if like is not None else []
    m = deployed_copy(model, example, fold, plan if weights else None)
    applied = apply_fake_quant(m, plan, weights=weights, activations=activations)
    emulate_tanh_gelu(m, like.tanh_gelu if like is not None else [], example)
    if aside:
        plain = deployed_copy(model, example, fold)
        for layer in aside:
            replace_module(m, layer, plain.get_submodule(layer))
        kept = set(aside)
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
        float_layers=count_float_layers(model) - len(plan.layers) + len(aside),
    )
