"""`quantstudy bench speed`: the fp16 engine against each FP8 engine of one prepared study.

The study's own harness (`speed.harness.measure_speed`: CUDA-graph replay, fp16 and FP8 rounds
interleaved, median and quartiles over rounds, x per round pair, kernel time per group) on the
study's own preparation (`study.prepare.prepare_study`: model, split, recipe, calibrated plan),
one FP8 engine per kernel, all in one set of rounds, so a fused and an unfused engine of the same
plan are each paired with the same fp16 rounds. Optionally the two FP8 engines' top-1 agreement
on every held-out image, and the fp16 engine under Inductor's max-autotune against default mode
(is the fp16 baseline as fast as Inductor can make it?). On a CPU the harness runs a short eager
check, marked not meaningful.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quantstudy.bench.provenance import CPU_REASON, collect_provenance
from quantstudy.bench.schema import Agreement, EngineSpeed, SpeedBench, SpeedResult
from quantstudy.engines.builders import build_fp8, build_half, set_numerics
from quantstudy.engines.run import run_engine
from quantstudy.env.machine import gpu_name
from quantstudy.record import SpeedSection, StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import CompileMode, Engine
from quantstudy.speed.harness import measure_speed
from quantstudy.speed.ideal import ideal_speed
from quantstudy.study.prepare import Prepared, prepare_study


def bench_speed(
    config: StudyConfig,
    kernels: Sequence[str],
    *,
    rounds: int = 30,
    iters: int = 20,
    agreement: bool = False,
    autotune_batch: int | None = None,
    argv: list[str] | None = None,
) -> SpeedBench:
    """Prepare `config`'s study and time its fp16 engine against one FP8 engine per kernel."""
    if agreement and not {"fused", "scaled_mm"} <= set(kernels):
        raise UserError("--agreement compares the fused and scaled_mm engines: time both")
    if autotune_batch is not None and config.device != "cuda":
        raise UserError("--fp16-autotune-batch needs a CUDA GPU (max-autotune tunes GPU kernels)")
    prepared = prepare_study(config)
    device = prepared.device
    if device.type == "cuda":
        set_numerics()
    provenance = collect_provenance(device, argv)
    result = _time_model(prepared, kernels, rounds, iters, agreement, autotune_batch)
    on_gpu = device.type == "cuda"
    return SpeedBench(
        provenance=provenance,
        meaningful=on_gpu,
        meaningless_reason=None if on_gpu else CPU_REASON,
        images=str(config.data),
        n_images=int(prepared.heldout_x.shape[0]),
        batches=list(config.batches),
        rounds=rounds,
        iters=iters,
        compile_mode=config.compile_mode,
        results=[result],
    )


def _time_model(
    prepared: Prepared,
    kernels: Sequence[str],
    rounds: int,
    iters: int,
    agreement: bool,
    autotune_batch: int | None,
) -> SpeedResult:
    config, device, x = prepared.config, prepared.device, prepared.heldout_x
    model, example, fold = prepared.model, prepared.example, prepared.recipe.weights.fold_bn
    mode = config.compile_mode
    fp16 = build_half(model, device, example, fold=fold, compile_mode=mode)
    built = {
        k: build_fp8(
            model,
            device,
            example,
            prepared.plan,
            fold=fold,
            compile_mode=mode,
            spec=config.replace(fp8_kernel=k).build_spec(),
        )
        for k in kernels
    }
    print(f"timing fp16 against FP8 {', '.join(built)}", flush=True)
    timed = {Engine.FP16: fp16, **{str(k): e for k, e in built.items()}}
    sections = measure_speed(
        timed, x, list(config.batches), rounds=rounds, iters=iters, compile_mode=mode
    )
    engines = []
    for kernel, fp8 in built.items():
        speed = sections[kernel]
        info = fp8.info()
        gpu = gpu_name(device)
        ideal, _ = ideal_speed(speed, prepared.inputs.recipe_info, [info], gpu)
        speed = speed.model_copy(update={"ideal": ideal})  # None off the GPU: nothing timed
        engines.append(
            EngineSpeed(
                fp8_kernel=kernel,
                fp8_real=len(info.fp8_real),
                fp8_emulated=len(info.fp8_emulated),
                fp8_stepped_aside=len(info.layout.stepped_aside),
                epilogue_activations=len(info.layout.epilogue),
                fp8_handoffs=len(info.layout.handoff),
                fp8_residual_sums=len(info.layout.residual),
                scaled_mm_output=info.layout.scaled_mm_output,
                speed=speed,
            )
        )
    same = None
    if agreement:
        with torch.no_grad():
            top = {k: run_engine(e, x, config.eval_batch).argmax(1) for k, e in built.items()}
        same = Agreement(
            n_images=int(x.shape[0]),
            same_top1=int((top["fused"] == top["scaled_mm"]).sum()),
        )
    tuned = None
    if autotune_batch is not None:
        print("timing fp16 default mode against fp16 max-autotune", flush=True)
        tuned = fp16_autotune(prepared, autotune_batch, rounds, iters)
    return SpeedResult(
        model=config.model,
        weights=prepared.model_info.weights_detail,
        recipe=prepared.inputs.recipe_source,
        selected=len(prepared.layers),
        engines=engines,
        fused_vs_unfused=same,
        fp16_max_autotune=tuned,
    )


def fp16_autotune(prepared: Prepared, batch: int, rounds: int, iters: int) -> SpeedSection:
    """The fp16 engine in default mode (the harness's fp16 slot) against itself under
    max-autotune (its FP8 slot): x above 1 means max-autotune made fp16 faster."""
    model, device, example = prepared.model, prepared.device, prepared.example
    fold = prepared.recipe.weights.fold_bn
    default = build_half(model, device, example, fold=fold, compile_mode=CompileMode.DEFAULT)
    tuned = build_half(model, device, example, fold=fold, compile_mode=CompileMode.MAX_AUTOTUNE)
    tuned.name = "fp16-max-autotune"
    return measure_speed(
        {"default": default, "max-autotune": tuned},
        prepared.heldout_x,
        [batch],
        rounds=rounds,
        iters=iters,
        compile_mode=CompileMode.MAX_AUTOTUNE,
    )["max-autotune"]
