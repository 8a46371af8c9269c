"""`run_study`: one study from model name to decision, stage by stage (docs/DESIGN.md).

1. Preparation (`prepare.py`): every user input is read and checked before any heavy work
   (`inputs.py`); then the images are decoded and the recipe's layers calibrated.
2. Engines: fp32 (the reference), fp16, FP8 and the fake-quant emulations, each run on the
   held-out and stress images.
3. Quality of every engine against fp32, the NaN/Inf scan, the FP8 engine against its emulation.
4. Speed: fp16 against FP8 with the speed harness (skipped with `speed=False`).
5. The decision under the policy, then the report (`report/`), rendered from the record alone.

After each stage the record is written atomically with status "partial"; engine outputs are
cached under `<out>/.cache`, keyed by everything that decides them, so an interrupted study
resumes where it stopped. A caller that measured more (a search) passes its sections in
(`RecordExtras`): the study writes its record whole, and nothing edits it afterwards.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quantstudy.data.split import summarize_set
from quantstudy.data.stream import Uint8Transform
from quantstudy.decision.policy import decide
from quantstudy.decision.preview import heldout_preview
from quantstudy.engines.base import Engine
from quantstudy.engines.builders import (
    build_fp8,
    set_numerics,
)
from quantstudy.engines.run import half_storage, reordered, run_engine
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quality.gap import gap_pairs
from quantstudy.quality.stress import stress_inputs
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import (
    EngineInfo,
    FP8Layout,
    KernelChoice,
    LayerSpeedSection,
    QualitySection,
    SearchSection,
    SensitivitySection,
    StudyRecord,
    Variant,
)
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.engines import FP16
from quantstudy.record.io import write_record
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.report.render import render_study
from quantstudy.speed.harness import measure_speed, speed_not_run
from quantstudy.speed.ideal import ideal_speed
from quantstudy.study.cache import StageCache, console
from quantstudy.study.checks import require_sound_reference
from quantstudy.study.config import StudyConfig
from quantstudy.study.engines import study_builders
from quantstudy.study.environment import collect_environment
from quantstudy.study.guard import check_batch_memory, claim_study_folder, device_memory
from quantstudy.study.heldout import (
    EnginePass,
    HeldoutResult,
    chunk_batches,
    run_heldout,
)
from quantstudy.study.inputs import StudyInputs, prepare_inputs
from quantstudy.study.per_image import PerImageResults, quality_section, seal, without_ids
from quantstudy.study.prepare import Prepared, prepare_study, study_device
from quantstudy.study.rounds import ROUND_IMAGES, Rounds
from quantstudy.study.speed_only import SPEED_ONLY_NOT_RUN, build_timed, timing_images
from quantstudy.study.stage_timer import StageTimer


@dataclass
class EngineOutputs:
    """Per-image rows of every engine on the held-out images, the logits of the stress
    inputs, and the two timed engines."""

    heldout: HeldoutResult
    stress: dict[str, torch.Tensor]
    timed: dict[str, Engine]
    rounds: Rounds | None = None  # the looks of a sequential study (`--heldout auto`)


@dataclass(frozen=True)
class RecordExtras:
    """Sections measured beside a study that belong in its record: a search puts its tables
    and the candidate recipe's variant into the verifying study's record from the start."""

    sensitivity: SensitivitySection | None = None
    layer_speed: LayerSpeedSection | None = None
    search: SearchSection | None = None
    variants: tuple[Variant, ...] = ()
    # what only the finished record knows (the search's `verified` figures): applied after the
    # decision, before the last write and the report
    complete: Callable[[StudyRecord], StudyRecord] | None = None

    @property
    def searched(self) -> bool:
        return self.sensitivity is not None or self.search is not None


NO_EXTRAS = RecordExtras()


def run_study(
    config: StudyConfig,
    force: bool = False,
    *,
    prepared: Prepared | None = None,
    extras: RecordExtras = NO_EXTRAS,
) -> tuple[StudyRecord, Path]:
    """Run one study; returns the record and the path of its Markdown report.

    `force`: replace a complete study of another configuration in the study folder.
    `prepared`: the study's preparation, when the caller made it (`prepare_study(config)`), so
    nothing is read twice. `extras`: sections the record holds beside the study's own."""
    if prepared is not None and prepared.config != config:
        raise ValueError("run_study: `prepared` was made for another config")
    timer, spec = StageTimer(), config.build_spec()  # the FP8 engine's, read once
    set_numerics()
    device = study_device(config.device)
    with timer.stage("load"):
        inputs = prepared.inputs if prepared is not None else prepare_inputs(config)
    check_batch_memory(config, inputs.pre.input_size, device_memory(device.type))
    if inputs.recipe_is_default:
        console.print(f"recipe: [bold]{inputs.recipe.name}[/bold] (the family default)")
    if config.quality:
        n_heldout = len(inputs.heldout_items)
        console.print(heldout_preview(inputs.policy, n_heldout, inputs.data.labelled))
    out_dir = config.out_dir(inputs.recipe.name)
    record = StudyRecord(
        name=config.study_name(inputs.recipe.name),
        status="partial",
        config=config.resolved(inputs.recipe_source, inputs.policy_label, spec.accumulation),
        environment=collect_environment(device),
        model=inputs.loaded.info,
        preprocessing=inputs.pre,
        data=inputs.data,
        recipe=inputs.recipe_info,
        variants=list(extras.variants),
        sensitivity=extras.sensitivity,
        layer_speed=extras.layer_speed,
        search=extras.search,
        not_run=_not_run(config, device, inputs.loaded.info.random_weights, extras.searched),
    )
    folder = claim_study_folder(out_dir, record, force)  # locked until released below
    _save(record, out_dir)
    cache = StageCache.keyed(
        out_dir / ".cache",
        [
            record.config.model_dump(mode="json", exclude={"out"}),  # a moved folder resumes
            inputs.recipe_info.sha256,
            inputs.loaded.info.weights_sha256,
            inputs.data.calibration.ids_sha256,
            inputs.data.heldout.ids_sha256,
            inputs.pre.model_dump(mode="json"),
            spec.key(),  # kernel, sums, lab switches, rewrites (`record/build_spec.py`)
        ],
    )

    if prepared is None:  # the images, then the calibration, each its own stage
        prepared = prepare_study(config, timer.stage, inputs)
    record = record.model_copy(
        update={"model": prepared.model_info, "calibration": prepared.calibration}
    )
    _save(record, out_dir)
    if config.quality:
        timed, record = _measure_quality(config, inputs, prepared.plan, cache, record, timer, spec)
        _save(record, out_dir)
        images = None
    else:  # speed only: the two timed engines, each compiled at every timed batch
        with timer.stage("images: timing"):
            images = timing_images(config, inputs)
        timed, infos = build_timed(config, inputs, prepared.plan, images, device, timer, spec)
        record = record.model_copy(update={"engines": infos})
        _save(record, out_dir)

    with timer.stage("timing"):
        record = _time(config, record, timed, images, inputs, out_dir)
    decision = decide(record, inputs.policy, inputs.policy_label)
    record = record.model_copy(update={"decision": decision, "status": "complete"})
    if extras.complete is not None:
        # `model_copy` does not validate: validate the whole record again
        record = StudyRecord.model_validate(extras.complete(record).model_dump(mode="json"))
    _save(record, out_dir)
    with timer.stage("report"):
        report = render_study(out_dir)
    record = record.model_copy(update={"timings": timer.section()})
    _save(record, out_dir)  # the report reads no timings: it stays as rendered
    folder.release()  # not left to garbage collection: a frame kept alive would keep the lock
    return record, report


def _measure_quality(
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
    _save(record, out_dir)
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
    """The timings' name of a held-out pass (the half-storage run by its dtype, as before)."""
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


def _time(
    config: StudyConfig,
    record: StudyRecord,
    timed: dict[str, Engine],
    images: torch.Tensor | None,
    inputs: StudyInputs,
    out_dir: Path,
) -> StudyRecord:
    """The speed section: fp16 against FP8 with the study's harness, on `images` (default: the
    first held-out images, `timing_images`)."""
    if not config.speed:
        return record.model_copy(
            update={"not_run": [*record.not_run, "Speed was not measured (--no-speed)."]}
        )
    images = images if images is not None else timing_images(config, inputs)
    console.print("speed: timing fp16 and fp8 engines")
    speed = measure_speed(
        {EngineName.FP16: timed[EngineName.FP16], EngineName.FP8: timed[EngineName.FP8]},
        images,
        list(config.batches),
        compile_mode=config.compile_mode,  # our name; COMPILE_MODES maps it to torch's
        package_dir=out_dir / "packages" if config.package else None,
    )[EngineName.FP8]
    ideal, why_not = ideal_speed(speed, record.recipe, record.engines, record.environment.gpu_name)
    speed = speed.model_copy(update={"ideal": ideal})
    missing = [*speed_not_run(speed), *([why_not] if why_not and speed.meaningful else [])]
    return record.model_copy(update={"speed": speed, "not_run": [*record.not_run, *missing]})


def _not_run(
    config: StudyConfig, device: torch.device, random_weights: bool, searched: bool
) -> list[str]:
    items = ["No TensorRT engine was built: TensorRT is not part of this study's engines."]
    if device.type != "cuda":
        items.append("GPU timings were not measured: the study ran on the CPU.")
    if not config.quality:
        items.append(SPEED_ONLY_NOT_RUN)
    elif random_weights:
        items.append("Accuracy was not measured meaningfully: the weights are random.")
    if not searched:
        items.append("Per-layer sensitivity and the recipe search were not run in this study.")
    items.append("Quantization-aware training was not tried.")
    return items


def _save(record: StudyRecord, out_dir: Path) -> None:
    write_record(out_dir / "study.json", record)
