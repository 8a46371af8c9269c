"""`quantstudy extend DIR --data MORE`: more held-out images for a finished study, decided again.

The study's own images are not run again: their per-image results come from its sealed side
file (`per_image.py`). The new folder's images must be other images than every image the
study used (held-out, calibration and earlier extensions): the same id (relative path) or the
same file content is an overlap, refused in one line (`--skip-used` leaves such images out
instead). The model, calibration and engines are rebuilt from the record's config, so the
study's data and calibration folders must still be there; an FP8 engine that chose its kernels
per layer (`--fp8-kernel fastest`) takes the choice its record holds, not a new timing.

The new images go through every engine in rounds (in a seeded random order), and the
quality gates are looked at after each round with the sequential rules
(`decision/sequential.py`): a look continues the study's last look (a fixed-N study's first
look is at all its images), so the intervals stay valid however often the study was looked
at. The study stops taking images when every gate settles or the folder runs out; the record
is rewritten whole (quality over every image, looks, extension, decision) and re-rendered.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from quantstudy.data.folders import FolderScan, ImageItem, scan_folder
from quantstudy.data.split import stream_order, summarize_set
from quantstudy.data.stream import Uint8Transform
from quantstudy.decision.policy import decide, load_policy
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quality.image_scores import RowSet
from quantstudy.quality.stress import stress_inputs
from quantstudy.record import StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_record
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import Engine
from quantstudy.report.render import render_study
from quantstudy.study.cache import StageCache
from quantstudy.study.checks import say_skipped
from quantstudy.study.guard import claim_study_folder
from quantstudy.study.heldout import chunk_batches, run_heldout
from quantstudy.study.per_image import (
    PerImageResults,
    quality_section,
    seal,
    set_ids,
    unseal,
    without_ids,
)
from quantstudy.study.prepare import prepare_study, study_device
from quantstudy.study.quality_stage import build_engines
from quantstudy.study.rounds import ROUND_IMAGES, Rounds
from quantstudy.study.stage_timer import StageTimer


def extend_study(study_dir: Path, more: Path, skip_used: bool = False) -> tuple[StudyRecord, Path]:
    """Add the images of `more` to the finished study in `study_dir`; the record and report.
    Its engines compute what the study's did: built from the study's config and the lab
    switches it ran under (`StudyConfig.build_spec`, `recorded`)."""
    study_dir = Path(study_dir)
    record = load_record(study_dir / RECORD_FILE)
    return _extend(study_dir, more, skip_used, record)


def _extend(
    study_dir: Path, more: Path, skip_used: bool, record: StudyRecord
) -> tuple[StudyRecord, Path]:
    if record.status != "complete":
        raise UserError(f"the study in {study_dir} is not finished; rerun it first, then extend")
    if not record.config.quality:
        raise UserError(
            f"the study in {study_dir} is speed only (--no-quality): it has no quality to extend; "
            "run it again without --no-quality"
        )
    previous = unseal(study_dir, record.per_image)
    config = record.config
    policy_name = (config.policy or "default").removeprefix("builtin:")
    config = config.replace(policy=policy_name)
    class_list = Path(config.class_list) if config.class_list else None
    scan = scan_folder(Path(more), class_list)
    say_skipped(scan)
    if scan.labelled != record.data.labelled:
        kind = "labelled" if record.data.labelled else "unlabelled"
        raise UserError(f"{more} must hold {kind} images, as the study's held-out folder does")
    items = stream_order(_new_items(study_dir, record, scan, skip_used), config.seed)
    if not items:
        raise UserError(f"{more} has no image the study has not used; give other images")
    policy, label = load_policy(policy_name)
    folder = claim_study_folder(study_dir, record)
    timer = StageTimer()
    prepared = prepare_study(config, timer.stage)
    device = study_device(config.device)
    # an FP8 engine that chose its kernels per layer is rebuilt as recorded, not timed again: a
    # layer kept in fp16 computes other numbers, and the new images must meet the engine scored
    spec = record.build_spec()
    built = build_engines(config, prepared.inputs, prepared.plan, None, device, timer, spec)
    rounds = Rounds(policy, list(record.sequential.looks) if record.sequential else [])
    if not rounds.looks:  # a fixed-N study: its first look is at every image it had
        rounds(previous.rows, previous.labels)
    cache = StageCache.keyed(study_dir / ".cache", ["extend", record.digest, str(more)])

    def stop(rows: RowSet, labels: np.ndarray | None) -> bool:
        return rounds(*_joined(previous, rows, labels))

    held = run_heldout(
        built.passes, built.pairs, items, Uint8Transform(EvalTransform(prepared.pre).steps),
        eval_batch=config.eval_batch, device=device, cache=cache, chunk_images=ROUND_IMAGES,
        stop=stop,
    )  # fmt: skip
    used = items[: held.n_images]
    added = PerImageResults(held.rows, [f"{Path(more).name}/{i.id}" for i in used], held.labels)
    results = previous.then(added)
    stress_names = [n for n, _ in stress_inputs(prepared.pre)]
    quality = quality_section(
        results, built.stress, stress_names, built.timed[Engine.FP8].dtype,
        prepared.inputs.loaded.info.random_weights, config.seed,
    )  # fmt: skip
    round_size = chunk_batches(config.eval_batch, ROUND_IMAGES) * config.eval_batch
    added_set = summarize_set("heldout", more, used, scan.labelled)
    data = without_ids(
        record.data.model_copy(update={"extended": [*record.data.extended, added_set]})
    )
    record = record.model_copy(
        update={
            "data": data,
            "quality": quality,
            "per_image": seal(study_dir, results),
            "sequential": rounds.section(round_size, None, len(results.ids)),
        }
    )
    record = StudyRecord.model_validate(record.model_dump(mode="json"))
    record = record.model_copy(update={"decision": decide(record, policy, label)})
    write_record(study_dir / RECORD_FILE, record)
    report = render_study(study_dir)
    folder.release()
    return record, report


def _joined(
    previous: PerImageResults, rows: RowSet, labels: np.ndarray | None
) -> tuple[RowSet, np.ndarray | None]:
    """The study's rows followed by the new images' rows so far, and their labels."""
    new = PerImageResults(rows, [""] * rows.n_images, labels)
    joined = previous.then(new)
    return joined.rows, joined.labels


def _new_items(
    study_dir: Path, record: StudyRecord, scan: FolderScan, skip_used: bool
) -> list[ImageItem]:
    """The images of `scan` that the study has not used, by id and by file content."""
    data = record.data
    roots = {
        "heldout": Path(data.data_dir),
        "calibration": Path(data.calib_dir or data.data_dir),
    }
    used_ids: set[str] = set()
    used_hashes: dict[str, str] = {}
    for image_set in (data.heldout, data.calibration, *data.extended):
        root = roots["calibration" if image_set.role == "calibration" else "heldout"]
        if image_set in data.extended:
            root = Path(image_set.folder)
        for image_id in set_ids(study_dir, record, image_set):
            used_ids.add(image_id)
            path = root / image_id
            if path.is_file():
                used_hashes[_content(path)] = image_id
    fresh: list[tuple[ImageItem, str | None]] = []
    overlap: list[tuple[ImageItem, str | None]] = []
    for item in scan.items:
        same = item.id if item.id in used_ids else used_hashes.get(_content(item.path))
        (overlap if same else fresh).append((item, same))
    if overlap and not skip_used:
        item, same = overlap[0]
        raise UserError(
            f"{len(overlap)} images of {scan.root} are already in the study (e.g. {item.id} is "
            f"the study's {same}); give a folder of other images, or --skip-used to leave them out"
        )
    return [item for item, _ in fresh]


def _content(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
