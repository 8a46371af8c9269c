"""`run_search`: from a candidate recipe to the searched recipe and its verifying study.

1. The candidate study (`run_study` with the candidate recipe; resumable like any study), from
   one preparation (`prepare_study`) that the search uses too: model, calibrated plan and
   held-out images are read once. The whole-model fp16 time and the candidate's own measured
   figures come from the study.
2. Per-layer sensitivity on a seeded subset of the held-out images.
3. Per-layer gains: measured on CUDA, or read from a gains file.
4. The budgeted choice (`select.py`) under the policy's quality budget, times `margin`.
5. The recipe file, checked to resolve to exactly the chosen layers.
6. The verifying study of that recipe (real engines, real timing where there is a GPU).

Everything lands in the search folder: `candidate/` and `searched/` (two ordinary studies),
`<recipe>.searched.yaml`, `search.json` (the sensitivity table, the per-layer speed table and the
search section, written after each step) and `sensitivity.png`.

The verifying study's record (`searched/study.json`) holds the tables too (`sensitivity`,
`layer_speed`, `search`, and the candidate recipe as a variant with its prediction and
measurement): `run_study` writes them with its own sections (`RecordExtras`), so its report shows
them and nothing edits the record afterwards.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.console import Console

from quantstudy.data.split import ids_sha256
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.recipe.builtin import default_recipe_for
from quantstudy.recipe.options import quant_options, with_quant_options
from quantstudy.recipe.schema import Recipe
from quantstudy.record import (
    LayerSpeedSection,
    Measured,
    OptionStep,
    SearchBudget,
    SearchSection,
    SensitivitySection,
    StudyConfig,
)
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.report.search_plots import write_sensitivity_plot
from quantstudy.search.compare import candidate_variant, measured, with_verified
from quantstudy.search.emit import write_recipe
from quantstudy.search.layer_speed import (
    NEEDS_CUDA,
    gains_for,
    load_layer_gains,
    measure_layer_speed,
)
from quantstudy.search.options import explore_options, for_layers
from quantstudy.search.select import (
    DEFAULT_MARGIN,
    LayerEvidence,
    budget_from_policy,
    predict,
    select_layers,
)
from quantstudy.search.sensitivity import measure_sensitivity
from quantstudy.study.prepare import Prepared, batches, prepare_study
from quantstudy.study.run import RecordExtras, run_study

console = Console(stderr=True)

SEARCH_JSON = "search.json"
OVERLAP_NOTE = (
    "The sensitivity images are a subset of the held-out images the verifying study scores, so "
    "its quality figures are not independent of the choice (mild selection bias)"
)


@dataclass(frozen=True)
class SearchConfig:
    """A search: the candidate study's config (its recipe is the candidate) and the search's own
    settings."""

    study: StudyConfig
    gains: Path | None = None  # per-layer gains JSON; None: measure them on CUDA
    batch: int | None = None  # batch of the gains and the prediction (default: see `_batch`)
    sensitivity_images: int = 256
    all_but: bool = False
    margin: float = DEFAULT_MARGIN
    out: Path | None = None
    options: bool = True  # try the FP8 quality options first (a calibration and emulation each)

    def out_dir(self, recipe: str) -> Path:
        if self.out is not None:
            return Path(self.out)
        s = self.study
        return Path("studies") / s.model.replace("/", "_") / f"search-{recipe}-seed{s.seed}"

    def __post_init__(self) -> None:
        if self.sensitivity_images < 1:
            raise UserError("--sensitivity-images must be a positive image count")


@dataclass(frozen=True)
class SearchResult:
    folder: Path
    sensitivity: SensitivitySection
    layer_speed: LayerSpeedSection
    search: SearchSection


def _batch(config: SearchConfig, gains: LayerSpeedSection | None) -> int:
    batch = config.batch or (gains.batch if gains else max(config.study.batches))
    if gains is not None and gains.batch != batch:
        raise UserError(f"the gains file is for batch {gains.batch}, not --batch {batch}")
    if config.study.speed and batch not in config.study.batches:
        raise UserError(
            f"the prediction is for batch {batch}, which the studies would not time; add it to "
            f"--batches (now {','.join(map(str, config.study.batches))})"
        )
    return batch


def _heldout_subset(prepared: Prepared, n: int) -> tuple[torch.Tensor, str, str]:
    """A seeded subset of the study's held-out images: tensor, description, ids hash."""
    items = prepared.inputs.heldout_items  # in the order of `prepared.heldout_x`
    seed = prepared.config.seed
    rng = random.Random(f"{seed}:sensitivity")
    picked = rng.sample(range(len(items)), min(n, len(items)))
    subset = sorted(picked, key=lambda i: items[i].id)
    ids_sha = ids_sha256([items[i].id for i in subset])
    what = (
        f"{len(subset)} of the {len(items)} held-out images, sampled with seed '{seed}:sensitivity'"
    )
    return prepared.heldout_x[subset], what, ids_sha


def _save(
    folder: Path,
    sensitivity: SensitivitySection,
    layer_speed: LayerSpeedSection | None,
    search: SearchSection | None,
) -> None:
    write_json_atomic(
        folder / SEARCH_JSON,
        {
            "sensitivity": sensitivity.model_dump(mode="json") if sensitivity else None,
            "layer_speed": layer_speed.model_dump(mode="json") if layer_speed else None,
            "search": search.model_dump(mode="json") if search else None,
        },
    )


def run_search(config: SearchConfig) -> SearchResult:
    """Run the whole search (module docstring); returns its tables and folder."""
    study = config.study
    # --- user input first: gains and GPU, then model, recipe, policy (`prepare_study`) -----
    gains_table = load_layer_gains(config.gains) if config.gains is not None else None
    if gains_table is None and (study.device != "cuda" or not torch.cuda.is_available()):
        raise UserError(NEEDS_CUDA)
    batch = _batch(config, gains_table)
    prepared = prepare_study(study)
    base, policy_label = prepared.recipe, prepared.inputs.policy_label
    budget = budget_from_policy(prepared.inputs.policy, policy_label, config.margin)
    recipe_name = study.recipe or default_recipe_for(prepared.inputs.loaded.info.architecture)
    folder = config.out_dir(base.name)
    if gains_table is not None:  # a figure for every candidate layer, before minutes of work
        gains_for(gains_table, prepared.layers)

    # --- 1. the candidate study ------------------------------------------------------------
    console.print(f"search: candidate study of [bold]{base.name}[/bold]")
    # the same preparation: naming the recipe and the folder changes nothing it read
    cand_config = study.replace(recipe=recipe_name, out=folder / "candidate")
    candidate, _ = run_study(cand_config, prepared=replace(prepared, config=cand_config))
    plan, layers = prepared.plan, prepared.layers

    # --- 1b. the FP8 quality options (`search/options.py`) -----------------------------------
    images, what, ids_sha = _heldout_subset(prepared, config.sensitivity_images)
    if config.options:
        base, plan, option_steps = _with_options(prepared, base, images)
    else:
        option_steps = []

    # --- 2. sensitivity --------------------------------------------------------------------
    sensitivity = _sensitivity(config, prepared, plan, base, (images, what, ids_sha))
    _save(folder, sensitivity, None, None)
    write_sensitivity_plot(sensitivity, folder)

    # --- 3. per-layer gains ----------------------------------------------------------------
    if gains_table is None:
        gains_table = _measure_gains(prepared, plan, base, batch)
    gains = gains_for(gains_table, layers)

    # --- 4. the choice ---------------------------------------------------------------------
    evidence = _evidence(sensitivity, gains, layers)
    cand_measured = measured(candidate, folder / "candidate", batch)
    search = _choose(evidence, budget, recipe_name, cand_measured, batch, option_steps)
    _save(folder, sensitivity, gains_table, search)
    if not any(c.chosen for c in search.choices):
        raise UserError(
            f"no layer pays under the quality budget ({budget.margin:g} of the policy's); no "
            f"recipe written. The tables are in {folder / SEARCH_JSON}"
        )

    # --- 5. the recipe file, 6. its study --------------------------------------------------
    path = _write_searched(folder, base, search, prepared, batch, (recipe_name, policy_label))
    console.print(f"search: verifying study of [bold]{path.stem}[/bold]")
    search = search.model_copy(update={"recipe_file": str(path)})
    extras = RecordExtras(
        sensitivity=sensitivity,
        layer_speed=gains_table,
        search=search,
        variants=(candidate_variant(candidate, search),),
        complete=with_verified(folder / "searched", batch),
    )
    searched = study.replace(recipe=str(path), out=folder / "searched")
    verified, _ = run_study(searched, extras=extras)
    assert verified.search is not None
    search = verified.search
    _save(folder, sensitivity, gains_table, search)
    return SearchResult(folder, sensitivity, gains_table, search)


def _sensitivity(
    config: SearchConfig,
    prepared: Prepared,
    plan: QuantPlan,
    base: Recipe,
    subset: tuple[torch.Tensor, str, str],
) -> SensitivitySection:
    """Each candidate layer quantized alone (or all but it) on the held-out `subset`
    (`_heldout_subset`: images, description, ids hash)."""
    images, what, ids_sha = subset
    study = config.study
    n = len(prepared.layers)
    console.print(f"search: sensitivity of {n} layers on {images.shape[0]} images")
    return measure_sensitivity(
        prepared.model,
        prepared.example,
        plan,
        images,
        fold=base.weights.fold_bn,
        all_but=config.all_but,
        batch=study.eval_batch,
        device=study.device,
        subset=what,
        ids_sha256=ids_sha,
    )


def _choose(
    evidence: list[LayerEvidence],
    budget: SearchBudget,
    recipe_name: str,
    cand_measured: Measured,
    batch: int,
    option_steps: list[OptionStep],
) -> SearchSection:
    """The budgeted choice (`select.py`) and its prediction beside the candidate's."""
    choices, method = select_layers(evidence, budget)
    chosen = [c.layer for c in choices if c.chosen]
    fp16_ms = cand_measured.fp16_ms if cand_measured.speed_meaningful else None
    return SearchSection(
        candidate_recipe=recipe_name,
        method=f"{method}. {OVERLAP_NOTE}",
        budget=budget,
        choices=choices,
        predicted=predict(evidence, chosen, batch, fp16_ms),
        candidate_predicted=predict(evidence, [e.layer for e in evidence], batch, fp16_ms),
        candidate_measured=cand_measured,
        options=option_steps,
    )


def _measure_gains(
    prepared: Prepared, plan: QuantPlan, base: Recipe, batch: int
) -> LayerSpeedSection:
    """Time each candidate layer in fp16 and FP8 at `batch` (`search/layer_speed.py`)."""
    study, layers = prepared.config, prepared.layers
    console.print(f"search: per-layer fp16/FP8 timing of {len(layers)} layers, batch {batch}")
    return measure_layer_speed(
        prepared.model,
        prepared.example,
        layers,
        batch=batch,
        per_channel=plan.per_channel,
        calibration=plan.calibration,
        fold=base.weights.fold_bn,
        compile_mode=study.compile_mode,
        spec=study.build_spec(),  # "fastest" is chosen over the fused engine
    )


def _evidence(
    sensitivity: SensitivitySection, gains: dict[str, float], layers: list[str]
) -> list[LayerEvidence]:
    """Each candidate layer's cost (KL, disagreement when quantized alone) and gain."""
    by_name = {row.layer: row for row in sensitivity.layers}
    return [
        LayerEvidence(n, by_name[n].kl_mean, 1.0 - by_name[n].agreement, gains[n]) for n in layers
    ]


def _with_options(
    prepared: Prepared, base: Recipe, images: torch.Tensor
) -> tuple[Recipe, QuantPlan, list[OptionStep]]:
    """The FP8 quality options explored on `images` (`search/options.py`): the recipe with the
    chosen ones, its plan, and the steps that chose them."""
    study = prepared.config
    console.print(f"search: FP8 quality options on {images.shape[0]} images")
    options, plan, option_steps = explore_options(
        prepared.model,
        prepared.example,
        prepared.layers,
        lambda: batches(prepared.calib_x, study.eval_batch, prepared.device),
        images,
        quant_options(base),
        batch=study.eval_batch,
        device=study.device,
    )
    return with_quant_options(base, options), plan, option_steps


def _write_searched(
    folder: Path,
    base: Recipe,
    search: SearchSection,
    prepared: Prepared,
    batch: int,
    names: tuple[str, str],
) -> Path:
    """Write the searched recipe (the chosen layers of `base`, each with its reason) into the
    search `folder`, with a header that says where it came from (`names`: the candidate
    recipe's and the policy's) and what it predicts."""
    (recipe_name, policy_label), layers = names, prepared.layers
    chosen = [c.layer for c in search.choices if c.chosen]
    name = f"{base.name}.searched"
    path = folder / f"{name}.yaml"
    p, budget = search.predicted, search.budget
    write_recipe(
        path,
        for_layers(base, chosen),
        chosen,
        prepared.model,
        prepared.example,
        name=name,
        description=(
            f"{len(chosen)} of the {len(layers)} layers of {base.name}, chosen by quantstudy "
            f"search for batch {batch} under {budget.margin:g} of the quality budget of "
            f"{policy_label}"
        ),
        reasons={c.layer: c.reason for c in search.choices},
        header=[
            f"Written by `quantstudy search {prepared.config.model}` from {recipe_name}.",
            f"Predicted (additive): saves {p.saved_ms:.4f} ms at batch {batch}, KL mean "
            f"{p.kl_mean:.3g}, agreement {100 * p.agreement:.2f}%;",
            "see search.json and the verifying study in searched/.",
        ],
    )
    return path
