"""Everything a study reads, resolved and checked before any heavy work starts.

A bad model name, folder, recipe or policy fails here, in seconds, not after calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from quantstudy.data.folders import FolderScan, ImageItem, scan_folder
from quantstudy.data.split import check_disjoint_content, split_items, stream_order, summarize_set
from quantstudy.decision.policy import load_policy
from quantstudy.decision.schema import Policy
from quantstudy.model.loading import LoadedModel, load_model
from quantstudy.model.macs import count_macs
from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.recipe.builtin import default_choice, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.recipe.schema import Recipe
from quantstudy.record import DataInfo, Preprocessing, RecipeInfo, StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.study.cache import console
from quantstudy.study.checks import (
    require_class_count,
    require_selection,
    say_shortfall,
    say_skipped,
)


@dataclass(frozen=True)
class StudyInputs:
    """The resolved inputs of one study."""

    loaded: LoadedModel
    pre: Preprocessing
    recipe: Recipe
    recipe_source: str
    recipe_info: RecipeInfo
    recipe_is_default: bool
    policy: Policy
    policy_label: str
    calib_items: list[ImageItem]
    heldout_items: list[ImageItem]
    data: DataInfo

    @property
    def example(self) -> torch.Tensor:
        """A zero image of the model's input size, for passes that need only shapes."""
        return torch.zeros(1, *self.pre.input_size)


@dataclass(frozen=True)
class StudySplit:
    """The scanned folders and the calibration/held-out split of a study's config."""

    scan: FolderScan
    calib_scan: FolderScan | None
    calib_items: list[ImageItem]
    heldout_items: list[ImageItem]


def split_study_data(config: StudyConfig) -> StudySplit:
    """Scan the data (and calibration) folders and split them as the study of `config` does:
    a search finds the same held-out images through this."""
    class_list = Path(config.class_list) if config.class_list else None
    scan = scan_folder(Path(config.data), class_list)
    calib_scan = scan_folder(Path(config.calib_data), class_list) if config.calib_data else None
    for scanned in (scan, calib_scan):
        if scanned is not None:
            say_skipped(scanned)
    calib_items, heldout_items = split_items(
        scan.items,
        config.calib,
        config.heldout_bound or len(scan.items),  # auto: every image left
        seed=config.seed,
        calib_items=calib_scan.items if calib_scan else None,
    )
    check_disjoint_content(calib_items, heldout_items)
    if config.sequential:  # looked at in rounds: the images must come in random order
        heldout_items = stream_order(heldout_items, config.seed)
    return StudySplit(scan, calib_scan, calib_items, heldout_items)


@dataclass(frozen=True)
class ChosenRecipe:
    """A recipe resolved against a model: what it is, where it came from, its layer table."""

    recipe: Recipe
    source: str  # "builtin:<name>", a file path, or "python:<name>" for a `Recipe` object
    info: RecipeInfo  # the record's recipe section: each layer, FP8 or not, and by which rule
    is_default: bool  # no recipe named: the model's family default (`recipe/builtin.py`)


def choose_recipe(
    given: str | Path | Recipe | None, model: nn.Module, model_name: str, example: torch.Tensor
) -> ChosenRecipe:
    """The recipe `given` names (a built-in name, a YAML file, a `Recipe`; None: the family
    default of `model_name`, and the console says which rule chose it) resolved against
    `model`; one that selects no layer is refused (`require_selection`). A study and
    `quantstudy.quantize` choose through here."""
    default = given is None
    if given is None:  # say which rule chose the default (module `recipe/builtin.py`)
        choice = default_choice(model_name)
        console.print(f"recipe {choice.describe()}")
        given = choice.recipe
    if isinstance(given, Recipe):
        recipe, source = given, f"python:{given.name}"
    else:
        recipe, source = load_recipe(given)
    resolution = resolve(recipe, model, example)
    require_selection(resolution, source, model_name)
    return ChosenRecipe(recipe, source, resolution.to_info(recipe, source), default)


def prepare_inputs(config: StudyConfig) -> StudyInputs:
    """Load the model, scan and split the data, resolve the recipe, read the policy."""
    loaded = load_model(
        config.model, config.weights, seed=config.seed, strip_prefix=config.strip_prefix
    )
    pre = resolve_preprocessing(loaded.model, test_settings=config.test_settings)
    split = split_study_data(config)
    scan, calib_scan = split.scan, split.calib_scan
    calib_items, heldout_items = split.calib_items, split.heldout_items
    example = torch.zeros(1, *pre.input_size)
    chosen = choose_recipe(config.recipe, loaded.model, config.model, example)
    policy, policy_label = load_policy(Path(config.policy) if config.policy else None)

    if not calib_items or not heldout_items:
        empty = "calibration" if not calib_items else "held-out"
        raise UserError(
            f"the {empty} set is empty: {config.data} has {len(scan.items)} usable images and "
            f"--calib {config.calib} takes them first. Lower --calib, or give calibration "
            "images of their own with --calib-data"
        )
    require_class_count(scan, loaded.info.num_classes)
    calib_root = config.calib_data or config.data
    say_shortfall("calibration", "--calib", config.calib, len(calib_items), calib_root)
    if isinstance(config.heldout, int):  # not sequential: auto[:MAX] takes what there is
        say_shortfall("held-out", "--heldout", config.heldout, len(heldout_items), config.data)
    data = DataInfo(
        data_dir=config.data,
        calib_dir=config.calib_data,
        class_list=str(scan.class_list) if scan.class_list else None,
        labelled=scan.labelled,
        seed=config.seed,
        skipped=scan.skipped + (calib_scan.skipped if calib_scan else []),
        calibration=summarize_set(
            "calibration",
            config.calib_data or config.data,
            calib_items,
            calib_scan.labelled if calib_scan else scan.labelled,
        ),
        heldout=summarize_set("heldout", config.data, heldout_items, scan.labelled),
    )
    macs = count_macs(loaded.model, example)
    loaded = LoadedModel(loaded.model, loaded.info.model_copy(update={"macs": macs}))
    return StudyInputs(
        loaded=loaded,
        pre=pre,
        recipe=chosen.recipe,
        recipe_source=chosen.source,
        recipe_info=chosen.info,
        recipe_is_default=chosen.is_default,
        policy=policy,
        policy_label=policy_label,
        calib_items=calib_items,
        heldout_items=heldout_items,
        data=data,
    )
