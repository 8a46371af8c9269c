"""The zoo's studies: one grid point of the sweep per model, and what each is asked to measure.

Every study times fp16 against FP8 at the zoo's batches with the fused FP8 kernel and the
model's default recipe (its family's, or the list entry's). The weights decide whether a study
also measures quality:
- random weights (`--weights random`, and any model without real weights here): speed only
  (`StudyConfig.quality` off). The kernels' time does not depend on the weights' values, so the
  timings hold; quality would describe an untrained network and is not measured.
- real weights (`--weights cache`: the entry's own `weights`, else the local timm cache where it
  holds the model's): the full study, quality against fp32 and the decision under the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantstudy.model.loading import has_cached_weights
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL, StudyConfig
from quantstudy.record.vocab import Device
from quantstudy.sweep.events import ExecutorKind, Transfer
from quantstudy.sweep.grid import GridPoint, recipe_file_sha256
from quantstudy.zoo.catalogue import ALL, Shard, WeightsMode, ZooEntry

DEFAULT_BATCHES = (1, 128)


@dataclass(frozen=True)
class ZooOptions:
    """`quantstudy zoo`: the list and its shard, the data, what each study measures, where the
    studies run."""

    data: Path
    out: Path
    calib_data: Path | None = None
    class_list: Path | None = None
    models: Path | None = None  # None: the committed list
    shard: Shard = ALL
    weights: WeightsMode = "random"
    device: Device | None = None  # None: cuda when available, else cpu
    batches: tuple[int, ...] = DEFAULT_BATCHES
    calib: int = 64  # enough for static scales; a speed study's numbers do not depend on them
    heldout: int = 256  # timing images (and, with real weights, the quality images)
    executor: ExecutorKind = "local"
    address: str | None = None
    transfer: Transfer = "auto"
    workers: int | None = None
    jobs: int | None = None  # studies sharing each GPU (`sweep/local.py`); None: the default
    rows: Path | None = None  # the committed rows (`zoo/rows.py`): kept where fresh, updated
    page: Path | None = None  # also write the leaderboard page here (its plot beside it)
    check_alone: tuple[str, ...] = ()  # models timed again alone after the run, to compare
    dry_run: bool = False
    run: bool = True  # False: write the leaderboard from what --out holds, run nothing
    command: tuple[str, ...] = field(default_factory=tuple)  # for the provenance


def weights_of(entry: ZooEntry, mode: WeightsMode) -> str:
    """The `--weights` of the entry's study under `mode`: real weights where present."""
    if mode == "random":
        return "random"
    if entry.weights is not None:
        return entry.weights
    return "cache" if has_cached_weights(entry.name) else "random"


def zoo_point(entry: ZooEntry, options: ZooOptions, device: str) -> GridPoint:
    """The grid point of one model's study (paths absolute: the study runs in its folder)."""
    weights = weights_of(entry, options.weights)
    config = StudyConfig(
        model=entry.name,
        weights=weights,
        recipe=entry.recipe,
        data=str(options.data.resolve()),
        calib_data=str(options.calib_data.resolve()) if options.calib_data else None,
        class_list=str(options.class_list.resolve()) if options.class_list else None,
        calib=options.calib,
        heldout=options.heldout,
        batches=options.batches,
        device=device,
        fp8_kernel=DEFAULT_FP8_KERNEL,
        speed=True,
        quality=weights != "random",
    )
    sha = recipe_file_sha256(entry.recipe) if entry.recipe else None
    return GridPoint(config=config, recipe_sha256=sha)


def row_settings(point: GridPoint) -> dict[str, object]:
    """What a row's study was asked, without this host's paths: a kept row must match it."""
    c = point.config
    weights = c.weights if c.weights in ("random", "cache") else Path(c.weights).name
    return {
        "weights": weights,
        "recipe": point.recipe if "/" not in point.recipe else Path(point.recipe).name,
        "batches": list(c.batches),
        "calib": c.calib,
        "heldout": c.heldout,
        "fp8_kernel": str(c.fp8_kernel or DEFAULT_FP8_KERNEL),
    }
