"""A study's per-image held-out results: scored into the quality section, kept in a side file.

The rows (`quality/image_scores.py`) of every engine and pair, with the image ids in pass order and
the labels, go into `per-image.pt` beside study.json, sealed by the record (`record/side.py`):
`quantstudy extend` reads them back to add images to a finished study without running its
first images again.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quantstudy.data.split import ids_sha256
from quantstudy.quality.gap import emulation_gap_rows
from quantstudy.quality.image_scores import RowSet
from quantstudy.quality.metrics import build_quality_section, score_many
from quantstudy.quality.nonfinite import scan_rows
from quantstudy.record import DataInfo, ImageSet, QualitySection, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import read_side_file, write_side_file
from quantstudy.record.side import PER_IMAGE_FILE, SideFile
from quantstudy.record.vocab import Engine


@dataclass(frozen=True)
class PerImageResults:
    """Rows, image ids (in pass order) and labels (None: unlabelled) of a held-out pass."""

    rows: RowSet
    ids: list[str]
    labels: np.ndarray | None

    def __post_init__(self) -> None:
        if len(self.ids) != self.rows.n_images:
            raise ValueError(f"{len(self.ids)} ids for {self.rows.n_images} rows")

    def then(self, more: PerImageResults) -> PerImageResults:
        """These images, then `more`'s."""
        if (self.labels is None) != (more.labels is None):
            raise ValueError("labelled and unlabelled results cannot be joined")
        labels = None if self.labels is None else np.concatenate([self.labels, more.labels])
        return PerImageResults(RowSet.concat([self.rows, more.rows]), self.ids + more.ids, labels)


def seal(folder: Path, results: PerImageResults) -> SideFile:
    """Write `results` beside study.json; the record's section for the file."""
    data = results.rows.to_tensors()
    data["ids"] = results.ids  # torch.save keeps a list of str
    if results.labels is not None:
        data["labels"] = torch.from_numpy(results.labels)
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return write_side_file(folder, PER_IMAGE_FILE, buffer.getvalue(), len(results.ids))


def unseal(folder: Path, side: SideFile | None) -> PerImageResults:
    """The results a study sealed; refused in one line when it has none or they changed."""
    if side is None:
        raise UserError(
            f"the study in {folder} keeps no per-image results (written before they were "
            "kept); rerun it, then extend it"
        )
    data = torch.load(io.BytesIO(read_side_file(folder, side)), weights_only=True)
    ids = list(data.pop("ids"))
    labels = data.pop("labels", None)
    rows = RowSet.from_tensors(data)
    return PerImageResults(rows, ids, None if labels is None else labels.numpy())


def without_ids(data: DataInfo) -> DataInfo:
    """`data` with its held-out sets' ids left to the per-image side file (`seal` writes them
    there): the record keeps each set's count and id hash, and stays small at any size."""
    return data.model_copy(
        update={
            "heldout": data.heldout.model_copy(update={"ids": None}),
            "extended": [s.model_copy(update={"ids": None}) for s in data.extended],
        }
    )


def set_ids(folder: Path, record: StudyRecord, image_set: ImageSet) -> list[str]:
    """The sorted ids of one of the study's image sets: from the record where it lists them,
    else from the per-image side file, where the held-out sets' rows follow each other (the
    held-out set, then each `extend` set in the order added, its ids under its folder's name),
    checked against the set's recorded hash."""
    if image_set.ids is not None:
        return list(image_set.ids)
    held = [record.data.heldout, *record.data.extended]
    if image_set not in held:
        raise ValueError(f"{image_set.role} set of {image_set.folder} is not in the record")
    index = held.index(image_set)
    start = sum(s.n_images for s in held[:index])
    rows = unseal(folder, record.per_image).ids[start : start + image_set.n_images]
    prefix = f"{Path(image_set.folder).name}/" if index else ""
    ids = sorted(i.removeprefix(prefix) for i in rows)
    if ids_sha256(ids) != image_set.ids_sha256:
        raise UserError(
            f"the per-image results in {folder} do not name the images the record's "
            f"{image_set.role} set of {image_set.folder} hashes to; rerun the study"
        )
    return ids


def quality_section(
    results: PerImageResults,
    stress: dict[str, torch.Tensor],
    stress_names: list[str],
    half: torch.dtype,
    random_weights: bool,
    seed: int,
) -> QualitySection:
    """Every engine against fp32, the NaN/Inf scan, and the FP8 engine against its emulation,
    from the rows of the held-out pass and the stress logits of each engine (in build order)."""
    rows, labels, ids = results.rows, results.labels, results.ids
    names = list(stress)
    comparisons = [(n, Engine.FP32) for n in names if n != Engine.FP32]
    # scored together: every engine's bootstraps share their index draws (`score_many`), on
    # as many threads as torch may use (1 in the tests; the cores on a study's machine)
    *engines, against_fp16 = score_many(
        [*comparisons, (Engine.FP8, Engine.FP16)],
        rows,
        labels,
        seed=seed,
        workers=torch.get_num_threads(),
    )
    return build_quality_section(
        Engine.FP32,
        engines,
        [scan_rows(n, rows.engines[n].valid, ids, stress[n], stress_names) for n in names],
        stress_names,
        None if labels is None else torch.from_numpy(labels),
        emulation_gap_rows(rows, half),
        random_weights,
        against_fp16=against_fp16,
    )
