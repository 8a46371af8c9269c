"""The quality stage of a study: every engine built and run on the stress inputs, the
held-out images streamed through all of them at once, then scored against fp32.

`run.py` calls `measure_quality`; `extend.py` reuses `build_engines` to rebuild a recorded
study's engines.
"""

from __future__ import annotations

import functools
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from quantstudy.data.split import summarize_set
from quantstudy.data.stream import Uint8Transform
from quantstudy.engines.base import Engine
from quantstudy.engines.builders import build_fp8
from quantstudy.engines.run import half_storage, reordered, run_engine
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quality.gap import gap_pairs
from quantstudy.quality.stress import stress_inputs
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import (
    EngineInfo,
    FP8Layout,
    KernelChoice,
    QualitySection,
    StudyConfig,
    StudyRecord,
)
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.engines import FP16
from quantstudy.record.io import write_record
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.study.cache import StageCache, console
from quantstudy.study.checks import require_sound_reference
from quantstudy.study.engines import study_builders
from quantstudy.study.heldout import EnginePass, HeldoutResult, chunk_batches, run_heldout
from quantstudy.study.inputs import StudyInputs
from quantstudy.study.per_image import PerImageResults, quality_section, seal, without_ids
from quantstudy.study.prepare import study_device
from quantstudy.study.rounds import ROUND_IMAGES, Rounds
from quantstudy.study.stage_timer import StageTimer


@dataclass
class EngineOutputs:
    """Per-image rows of every engine on the held-out images, the logits of the stress
    inputs, and the two timed engines."""

    heldout: HeldoutResult
    stress: dict[str, torch.Tensor]
    timed: dict[str, Engine]
    rounds: Rounds | None = None  # the looks of a sequential study (`--heldout auto`)


def measure_quality(
    config: StudyConfig,
    inputs: StudyInputs,
    plan: QuantPlan,
    cache: StageCache,
    record: StudyRecord,
    timer: StageTimer,
    spec: BuildSpec,
) -> tuple[dict[str, Engine], StudyRecord]:
    """Every engine through the held-out images, then the quality section; returns the two timed
    engines and the record with engines, quality and per-image results."""
    out_dir = config.out_dir(inputs.recipe.name)
    device = study_device(config.device)
    outputs, infos = _run_engines(config, inputs, plan, cache, device, timer, spec)
    record = record.model_copy(update={"engines": infos, **_sequential(config, inputs, outputs)})
    write_record(out_dir / "study.json", record)
    with timer.stage("score"):
        quality, results = _score(config, inputs, outputs)
        per_image = seal(out_dir, results)
    record = record.model_copy(
        update={"quality": quality, "per_image": per_image, "data": without_ids(record.data)}
    )
    return outputs.timed, record


@dataclass
class Built:
    """Every engine of a study, built and run on the stress inputs, and its held-out passes."""

    passes: list[EnginePass]
    pairs: list[tuple[str, str]]
    stress: dict[str, torch.Tensor]
    timed: dict[str, Engine]
    infos: list[EngineInfo]
    cache: StageCache | None  # the engines' outputs' cache, refined by the FP8 engine's choice


def build_engines(
    config: StudyConfig,
    inputs: StudyInputs,
    plan: QuantPlan,
    cache: StageCache | None,
    device: torch.device,
    timer: StageTimer,
    spec: BuildSpec,
) -> Built:
    """Build every engine and run each on the stress inputs (cached per engine); the passes
    and pairs the held-out images go through (`study/heldout.py`). `spec`: the FP8 engine's
    (a recorded per-layer kernel choice replayed, `quantstudy extend`). The FP8 engine's layout
    goes, as built, to the engines after it (its emulations, its float32 twin)."""
    stress_x = torch.stack([t for _, t in stress_inputs(inputs.pre)])
    fold = inputs.recipe.weights.fold_bn
    builders = study_builders(config, inputs.loaded.model, inputs.example, plan, fold, device, spec)
    # the stress inputs in the held-out batches' shape: a compiled engine compiles once for both
    batch = min(config.eval_batch, len(inputs.heldout_items))
    built = Built([], [], {}, {}, [], cache)
    layout = FP8Layout()  # the FP8 engine's, once built
    for name, build in builders.items():
        console.print(f"engine [bold]{name}[/bold]: building")
        with timer.stage(f"engine {name}: build"):
            engine = build(layout)
        built.infos.append(engine.info())
        if name == EngineName.FP8:
            layout = built.infos[-1].layout
        stepped = layout.stepped_aside
        if name == EngineName.FP8 and stepped and cache is not None:
            # the layers kept in fp16 were timed, not given: the FP8 engine and its emulations
            # resumed on another machine may keep others, so their outputs are keyed by them
            cache = built.cache = cache.refined(sorted(stepped))
        # a compiled engine compiles on its first call; these passes are not timed, so the FP8
        # kernels tune only at the timed batches (`_untimed_tiles`)
        with timer.stage(f"engine {name}: stress"), _untimed_tiles(device):
            run = functools.partial(run_engine, engine, stress_x, batch, pad=True)
            built.stress[name] = cache.get_or_compute(f"stress-{name}", run) if cache else run()
        built.passes.append(EnginePass(name, engine))
        if name in (EngineName.FP16, EngineName.FP8):
            built.timed[name] = engine
        if name == EngineName.FAKEQUANT:
            half = built.timed[EngineName.FP8].dtype  # the floor of the storage the FP8 engine uses
            built.passes += [
                EnginePass("fakequant_reordered", engine, functools.partial(reordered, engine)),
                EnginePass("fakequant_half", engine, functools.partial(half_storage, engine, half)),
            ]
    if config.float32_engine:
        with timer.stage("engine fp8 in float32: build"):
            fp8 = _float32_fp8(spec, inputs, plan, device, layout)
            built.passes.append(EnginePass("fp8_float32", fp8))
    names = [p.name for p in built.passes]
    built.pairs = [(EngineName.FP32, n) for n in built.stress if n != EngineName.FP32]
    built.pairs += [(EngineName.FP16, EngineName.FP8), *gap_pairs(names)]
    return built


def _run_engines(
    config: StudyConfig,
    inputs: StudyInputs,
    plan: QuantPlan,
    cache: StageCache,
    device: torch.device,
    timer: StageTimer,
    spec: BuildSpec,
) -> tuple[EngineOutputs, list[EngineInfo]]:
    """Build every engine, then stream the held-out images through all of them at once."""
    built = build_engines(config, inputs, plan, cache, device, timer, spec)
    passes, pairs, stress, timed = built.passes, built.pairs, built.stress, built.timed
    cache = built.cache or cache
    infos = built.infos
    rounds = Rounds(inputs.policy) if config.sequential else None
    start = time.perf_counter()
    with _untimed_tiles(device):
        heldout = run_heldout(
            passes,
            pairs,
            inputs.heldout_items,
            Uint8Transform(EvalTransform(inputs.pre).steps),
            eval_batch=config.eval_batch,
            device=device,
            cache=cache,
            chunk_images=ROUND_IMAGES if rounds else None,
            stop=rounds,
            reference_check=lambda logits: require_sound_reference(logits, config.model),
        )
    # the passes interleave chunk by chunk: each engine's share is a stage of its own
    for name, seconds in heldout.seconds.items():
        timer.add(f"held-out: {_stage_name(name, timed)}", seconds)
    rest = time.perf_counter() - start - sum(heldout.seconds.values())
    timer.add("held-out: per-image rows and cache", rest)
    return EngineOutputs(heldout, stress, timed, rounds), infos


def _sequential(config: StudyConfig, inputs: StudyInputs, outputs: EngineOutputs) -> dict[str, Any]:
    """A sequential study's record updates: the held-out images it looked at (the first of
    its random order) and its looks."""
    rounds = outputs.rounds
    if rounds is None:
        return {}
    used = inputs.heldout_items[: outputs.heldout.n_images]
    heldout = summarize_set("heldout", config.data, used, inputs.data.labelled)
    round_size = chunk_batches(config.eval_batch, ROUND_IMAGES) * config.eval_batch
    section = rounds.section(round_size, config.heldout_bound, len(inputs.heldout_items))
    return {
        "data": inputs.data.model_copy(update={"heldout": heldout}),
        "sequential": section,
    }


def _stage_name(name: str, timed: dict[str, Engine]) -> str:
    """The timings' name of a held-out pass (the half-storage one by its dtype, as records say)."""
    if name == "fakequant_half":
        return "fakequant " + str(timed[EngineName.FP8].dtype).removeprefix("torch.") + " storage"
    return name


def _float32_fp8(
    spec: BuildSpec,
    inputs: StudyInputs,
    plan: QuantPlan,
    device: torch.device,
    layout: FP8Layout,
) -> Engine:
    """The study's FP8 engine, of `layout`, built in float32 and run eagerly (quality only):
    its kernel, fused where it chose per layer, and the float layers it kept in fp16
    (`engines/step_aside.py`)."""
    if layout.kernel_choice is not None:
        kept = [c for c in layout.kernel_choice if c.kernel == FP16]
        spec = spec.but(choice=KernelChoice.replayed(kept))
    fp8 = build_fp8(
        inputs.loaded.model, device, inputs.example, plan,
        fold=inputs.recipe.weights.fold_bn, spec=spec, dtype=torch.float32,
    )  # fmt: skip
    return fp8.eagerly()


def _untimed_tiles(device: torch.device) -> AbstractContextManager[object]:
    """On CUDA, the fused FP8 product's launches that were never tuned take a tile untimed
    (`quant/kernels/tuning.py: untimed_tiles`): a quality pass's outputs are the same bits under
    every tile, and its time is not measured, so autotuning it would only cost compile time."""
    if device.type != "cuda":
        return nullcontext()
    from quantstudy.quant.kernels.tuning import untimed_tiles

    return untimed_tiles()


def _score(
    config: StudyConfig, inputs: StudyInputs, outputs: EngineOutputs
) -> tuple[QualitySection, PerImageResults]:
    """The quality section of the held-out pass, and its per-image results."""
    held = outputs.heldout
    ids = [item.id for item in inputs.heldout_items[: held.n_images]]
    results = PerImageResults(held.rows, ids, held.labels)
    stress_names = [n for n, _ in stress_inputs(inputs.pre)]
    half = outputs.timed[EngineName.FP8].dtype
    random_weights = inputs.loaded.info.random_weights
    section = quality_section(
        results, outputs.stress, stress_names, half, random_weights, config.seed
    )
    return section, results
