"""The grid of a sweep: one `GridPoint` per study, its folder name and the config its study runs.

A point's folder is named from a stable hash of every setting that decides its numbers (and of
the bytes of a recipe file), so a rerun finds the same folder, and changing a setting or editing
a recipe file gives a new one instead of mixing two studies in one folder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.family import architecture_of
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Calibrator
from quantstudy.sweep.spec import DEFAULT_RECIPE, SweepSpec

DERIVED_RECIPE = "recipe.yaml"  # in a point's folder: its recipe with the sweep's calibrator
FIXED_AXES = ("recipe", "seed", "fp8_kernel")  # every point's folder name and label say these


class GridPoint(BaseModel):
    """One study of the sweep: the config its study runs (paths absolute) and what the sweep
    adds to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # `out` None; `recipe` None: the study's own default for the model (a sweep file's
    # `default` is resolved to the family's recipe name when the grid is expanded)
    config: StudyConfig
    calibrator: Calibrator | None = None  # None: the recipe's own
    recipe_sha256: str | None = None  # of a recipe file's bytes when the grid was expanded
    # the sweep's axes beyond `FIXED_AXES`, named in the point's label; not part of its key (a
    # point's settings are its config), so a folder's name is the same however it was swept
    swept: tuple[str, ...] = Field((), exclude=True)

    @property
    def recipe(self) -> str:
        """The point's recipe: a built-in name or a recipe file."""
        return self.config.recipe or DEFAULT_RECIPE

    @property
    def key(self) -> str:
        """SHA-256 of the settings (a recipe file's hash included) as sorted JSON."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def folder_name(self) -> str:
        """`<architecture>-<recipe>-<calibrator>-s<seed>-<kernel>-<hash>`, safe as a path."""
        parts = [
            architecture_of(self.config.model),
            _recipe_name(self.recipe),
            self.calibrator or "own",
            f"s{self.config.seed}",
            str(self.config.fp8_kernel),
            self.key[:10],
        ]
        return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts))

    @property
    def label(self) -> str:
        """Short name for progress lines: model / recipe / calibrator / seed / kernel."""
        c = self.config
        parts = (c.model, _recipe_name(self.recipe), self.calibrator or "own", f"s{c.seed}")
        more = [f"{o}={getattr(c, o)}" for o in self.swept]
        return " / ".join((*parts, str(c.fp8_kernel), *more))

    def recipe_arg(self, folder: Path) -> str:
        """The recipe of this point's study; writes the derived recipe when the sweep sets the
        calibrator and it differs from the recipe's own (a bad recipe raises `UserError`)."""
        if self.calibrator is None:
            return self.recipe
        recipe, _ = load_recipe(self.recipe)
        if recipe.activations.calibrator == self.calibrator:
            return self.recipe
        derived = recipe.model_dump(mode="json")
        derived["name"] = f"{recipe.name}-{self.calibrator}"
        derived["variant_of"] = recipe.name
        derived["description"] = (
            f"{recipe.description} (activation calibrator {self.calibrator}, set by the sweep)"
        ).strip()
        # the calibrator's own parameters (its defaults), not the recipe's calibrator's
        derived["activations"] = {
            **{k: v for k, v in derived["activations"].items() if k != "params"},
            "calibrator": str(self.calibrator),
        }
        path = folder / DERIVED_RECIPE
        path.write_text(yaml.safe_dump(derived, sort_keys=False), encoding="utf-8")
        return DERIVED_RECIPE  # relative: the study runs in its folder

    def study_config(self, folder: Path) -> StudyConfig:
        """The config the study runs with `folder` as working directory.

        The study's folder and a derived recipe are given relative to it (`out` "."), so the
        record reads the same wherever the folder was when the study ran (a Ray worker's
        temporary folder, or --out itself)."""
        recipe = self.config.recipe if self.calibrator is None else self.recipe_arg(folder)
        return self.config.replace(recipe=recipe, out=".")


def _recipe_name(recipe: str) -> str:
    return Path(recipe).stem if "/" in recipe else recipe


def expand(spec: SweepSpec, device: str) -> list[GridPoint]:
    """The grid, in the order models x recipes x calibrators x seeds x kernels x the other
    axes (`spec.axes`); every point's config takes the sweep's study options as they are, so a
    study option needs nothing here to be shared or swept."""
    points = []
    calibrators: list[Calibrator | None] = [*spec.calibrators] if spec.calibrators else [None]
    swept = tuple(o for o in spec.axes if o not in FIXED_AXES)
    for m in spec.models:
        own = m.model_dump(exclude={"name", "recipe"}, exclude_none=True)
        recipes = [m.recipe] if m.recipe is not None else spec.axes["recipe"]
        recipes = [default_recipe_for(m.name) if r == DEFAULT_RECIPE else r for r in recipes]
        axes = {**spec.axes, "recipe": tuple(dict.fromkeys(recipes))}
        for recipe, calibrator, *values in itertools.product(
            axes["recipe"], calibrators, *(axes[o] for o in axes if o != "recipe")
        ):
            chosen = dict(zip([o for o in axes if o != "recipe"], values, strict=True))
            fields = spec.settings | own | chosen | {"recipe": recipe}
            config = _config(fields | {"model": m.name, "device": device}, spec.source)
            sha = recipe_file_sha256(recipe)
            points.append(
                GridPoint(config=config, calibrator=calibrator, recipe_sha256=sha, swept=swept)
            )
    names = [p.folder_name for p in points]
    if len(set(names)) != len(names):
        raise UserError("two grid points have the same settings; list each value once")
    return points


def _config(fields: dict[str, Any], source: str) -> StudyConfig:
    """One point's config; options that do not go together are refused naming the file."""
    try:
        return StudyConfig(**fields)
    except UserError as err:
        raise UserError(f"{source}: the study of {fields['model']}: {err}") from None


def recipe_file_sha256(recipe: str) -> str | None:
    """Hash of a recipe file, so editing it gives new folders; None for a built-in name (a
    missing file fails in its study, recorded there)."""
    path = Path(recipe)
    if not (path.is_absolute() and path.is_file()):
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()
