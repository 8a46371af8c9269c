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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from quantstudy.decision.policy import decide
from quantstudy.decision.preview import heldout_preview
from quantstudy.engines.base import Engine
from quantstudy.engines.builders import set_numerics
from quantstudy.record import (
    LayerSpeedSection,
    SearchSection,
    SensitivitySection,
    StudyConfig,
    StudyRecord,
    Variant,
)
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.io import write_record
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.report.render import render_study
from quantstudy.speed.harness import measure_speed, speed_not_run
from quantstudy.speed.ideal import ideal_speed
from quantstudy.study.cache import StageCache, console
from quantstudy.study.environment import collect_environment
from quantstudy.study.guard import check_batch_memory, claim_study_folder, device_memory
from quantstudy.study.inputs import StudyInputs, prepare_inputs
from quantstudy.study.prepare import Prepared, prepare_study, study_device
from quantstudy.study.quality_stage import measure_quality
from quantstudy.study.speed_only import SPEED_ONLY_NOT_RUN, build_timed, timing_images
from quantstudy.study.stage_timer import StageTimer


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
    record = _first_record(config, inputs, extras, spec, device)
    folder = claim_study_folder(out_dir, record, force)  # locked until released below
    _save(record, out_dir)
    cache = _stage_cache(out_dir, record, inputs, spec)

    if prepared is None:  # the images, then the calibration, each its own stage
        prepared = prepare_study(config, timer.stage, inputs)
    record = record.model_copy(
        update={"model": prepared.model_info, "calibration": prepared.calibration}
    )
    _save(record, out_dir)
    if config.quality:
        timed, record = measure_quality(config, inputs, prepared.plan, cache, record, timer, spec)
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


def _first_record(
    config: StudyConfig,
    inputs: StudyInputs,
    extras: RecordExtras,
    spec: BuildSpec,
    device: torch.device,
) -> StudyRecord:
    """The record as the study starts: its inputs resolved, nothing measured yet."""
    return StudyRecord(
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


def _stage_cache(
    out_dir: Path, record: StudyRecord, inputs: StudyInputs, spec: BuildSpec
) -> StageCache:
    """The engine outputs' cache, keyed by everything that decides them."""
    return StageCache.keyed(
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
