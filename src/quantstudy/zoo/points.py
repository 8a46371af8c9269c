"""The zoo's studies: one grid point of the sweep per model, and what each is asked to measure.

Every study times fp16 against FP8 at the zoo's batches with the fused FP8 kernel and the
model's default recipe (its family's, or the list entry's), under every other study option as
`quantstudy run` has it: the zoo takes each from `StudyConfig` itself (`ZooOptions.study`, the
`zoo` command's flags derived from the config's fields), so a study option (`--fp8-accumulate`,
say) reaches the zoo's studies without this file naming it; `ZOO_DEFAULTS` are the few the zoo
sets otherwise. The weights decide whether a study also measures quality:
- random weights (`--weights random`, and any model without real weights here): speed only
  (`StudyConfig.quality` off). The kernels' time does not depend on the weights' values, so the
  timings hold; quality would describe an untrained network and is not measured.
- real weights (`--weights cache`: the entry's own `weights`, else the local timm cache where it
  holds the model's): the full study, quality against fp32 and the decision under the policy
  (unless `--no-quality`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantstudy.record import StudyConfig
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL
from quantstudy.sweep.events import ExecutorKind, Transfer
from quantstudy.sweep.grid import GridPoint, recipe_file_sha256
from quantstudy.zoo.catalogue import ALL, Shard, WeightsMode, ZooEntry

# The study options a zoo sets unlike `quantstudy run`: two timed batches, the calibration
# images static scales need (a speed study's numbers do not depend on them), enough timing
# images, and the fused kernel named (a row says which kernel it timed).
ZOO_DEFAULTS: dict[str, Any] = {
    "batches": (1, 128),
    "calib": 64,
    "heldout": 256,
    "fp8_kernel": DEFAULT_FP8_KERNEL,
}
# Study options the zoo decides per model or has its own flag for: the model and its weights (the
# list's, under `--weights`), its folder (`--out` is the zoo's), the images (`--data`, the zoo's
# own: not needed to write the page from the rows) and whether quality is scored (the weights').
ZOO_OWN = ("model", "weights", "out", "data")
ZOO_STUDY_OPTIONS = tuple(f for f in StudyConfig.model_fields if f not in ZOO_OWN)
# A row's settings beyond these (`row_settings`) are said only where a run sets them: the rows
# committed before the zoo took every study option keep matching a run that sets none.
ROW_SETTINGS = ("weights", "recipe", "batches", "calib", "heldout", "fp8_kernel")
# Options that say where this host keeps a file or what it runs on, not what the row measured.
HOST_OPTIONS = ("data", "calib_data", "class_list", "device", "out", "model", "speed", "quality")


@dataclass(frozen=True)
class ZooOptions:
    """`quantstudy zoo`: the list and its shard, the data, what each study measures (`study`:
    study options by `StudyConfig` field, over `ZOO_DEFAULTS`), where the studies run."""

    data: Path
    out: Path
    models: Path | None = None  # None: the committed list
    shard: Shard = ALL
    weights: WeightsMode = "random"
    study: Mapping[str, Any] = field(default_factory=dict)
    executor: ExecutorKind = "local"
    address: str | None = None
    transfer: Transfer = "auto"
    workers: int | None = None
    jobs: int | None = None  # studies sharing each GPU (`sweep/local.py`); None: the default
    rows: Path | None = None  # the committed rows (`zoo/row_files.py`): kept where fresh, updated
    page: Path | None = None  # also write the leaderboard page here (its plot beside it)
    check_alone: tuple[str, ...] = ()  # models timed again alone after the run, to compare
    dry_run: bool = False
    run: bool = True  # False: write the leaderboard from what --out holds, run nothing
    command: tuple[str, ...] = field(default_factory=tuple)  # for the provenance

    @property
    def settings(self) -> dict[str, Any]:
        """The study options every study of the zoo shares: `ZOO_DEFAULTS`, then `study`."""
        return ZOO_DEFAULTS | dict(self.study)

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(self.settings["batches"])

    @property
    def device(self) -> str | None:
        """The device asked for; None: cuda when available, else cpu."""
        device = self.study.get("device")
        return None if device is None else str(device)


def weights_of(entry: ZooEntry, mode: WeightsMode) -> str:
    """The `--weights` of the entry's study under `mode`: real weights where present."""
    if mode == "random":
        return "random"
    if entry.weights is not None:
        return entry.weights
    from quantstudy.model.loading import has_cached_weights  # imports torch: the command's parser
    # reads this module

    return "cache" if has_cached_weights(entry.name) else "random"


def zoo_point(entry: ZooEntry, options: ZooOptions, device: str) -> GridPoint:
    """The grid point of one model's study (paths absolute: the study runs in its folder)."""
    weights = weights_of(entry, options.weights)
    given = options.settings | {"data": options.data}
    paths = {k: str(Path(v).resolve()) for k, v in given.items() if _is_file_option(k, v)}
    own = entry.model_dump(exclude={"name", "weights"}, exclude_none=True)
    quality = weights != "random" and given.get("quality", True)
    fields = given | paths | own | {"model": entry.name, "weights": weights, "device": device}
    config = StudyConfig(**fields | {"quality": quality})
    sha = recipe_file_sha256(config.recipe) if config.recipe else None
    return GridPoint(config=config, recipe_sha256=sha)


def _is_file_option(option: str, value: Any) -> bool:
    """A study option naming a file or folder of this host (made absolute for the study)."""
    if option in ("data", "calib_data", "class_list"):
        return value is not None
    if option == "policy":  # a preset's name stays a name
        return value is not None and (Path(value).is_file() or "/" in str(value))
    return option == "recipe" and value is not None and str(value).endswith((".yaml", ".yml"))


def row_settings(point: GridPoint) -> dict[str, object]:
    """What a row's study was asked, without this host's paths: a kept row must match it. Past
    `ROW_SETTINGS`, each option the run sets otherwise than `StudyConfig`'s default is named."""
    c = point.config
    weights = c.weights if c.weights in ("random", "cache") else Path(c.weights).name
    said: dict[str, object] = {
        "weights": weights,
        "recipe": point.recipe if "/" not in point.recipe else Path(point.recipe).name,
        "batches": list(c.batches),
        "calib": c.calib,
        "heldout": c.heldout,
        "fp8_kernel": str(c.fp8_kernel or DEFAULT_FP8_KERNEL),
    }
    for name, info in StudyConfig.model_fields.items():
        value = getattr(c, name)
        if name in ROW_SETTINGS or name in HOST_OPTIONS or value == info.default:
            continue
        said[name] = Path(value).name if name == "policy" else _plain(value)
    return said


def _plain(value: Any) -> object:
    """A config value as JSON holds it (a row's settings are compared after a round trip)."""
    if isinstance(value, tuple):
        return list(value)
    return value if isinstance(value, (bool, int, float)) else str(value)
