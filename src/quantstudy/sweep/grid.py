"""The grid of a sweep: one `GridPoint` per study, its folder name and its `quantstudy run` line.

A point's folder is named from a stable hash of every setting that decides its numbers (and of
the bytes of a recipe file), so a rerun finds the same folder, and changing a setting or editing
a recipe file gives a new one instead of mixing two studies in one folder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from quantstudy.recipe.builtin import architecture_of, default_recipe_for, load_recipe
from quantstudy.record.errors import UserError
from quantstudy.sweep.spec import DEFAULT_RECIPE, SweepSpec

DERIVED_RECIPE = "recipe.yaml"  # in a point's folder: its recipe with the sweep's calibrator


class GridPoint(BaseModel):
    """Every setting of one study of the sweep (paths absolute)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    weights: str
    strip_prefix: str | None = None
    recipe: str  # built-in name or recipe file; `default` resolved to the family's name
    recipe_sha256: str | None = None  # of a recipe file's bytes when the grid was expanded
    calibrator: str | None = None  # None: the recipe's own
    seed: int
    fp8_kernel: str
    data: str
    calib_data: str | None = None
    class_list: str | None = None
    calib: int
    heldout: int
    batches: list[int]
    policy: str | None = None
    device: str
    compile_mode: str
    speed: bool
    test_settings: bool

    @property
    def key(self) -> str:
        """SHA-256 of the settings (a recipe file's hash included) as sorted JSON."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def folder_name(self) -> str:
        """`<architecture>-<recipe>-<calibrator>-s<seed>-<kernel>-<hash>`, safe as a path."""
        recipe = Path(self.recipe).stem if "/" in self.recipe else self.recipe
        parts = [
            architecture_of(self.model),
            recipe,
            self.calibrator or "own",
            f"s{self.seed}",
            self.fp8_kernel,
            self.key[:10],
        ]
        return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts))

    @property
    def label(self) -> str:
        """Short name for progress lines: model / recipe / calibrator / seed / kernel."""
        recipe = Path(self.recipe).stem if "/" in self.recipe else self.recipe
        parts = (self.model, recipe, self.calibrator or "own", f"s{self.seed}", self.fp8_kernel)
        return " / ".join(parts)

    def recipe_arg(self, folder: Path) -> str:
        """The `--recipe` of this point; writes the derived recipe when the sweep sets the
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
            "calibrator": self.calibrator,
        }
        path = folder / DERIVED_RECIPE
        path.write_text(yaml.safe_dump(derived, sort_keys=False), encoding="utf-8")
        return DERIVED_RECIPE  # relative: the study runs in its folder

    def argv(self, folder: Path) -> list[str]:
        """The `quantstudy run` command of this point, run with `folder` as working directory.

        The study's folder and a derived recipe are given relative to it (`--out .`), so the
        record reads the same wherever the folder was when the study ran (a Ray worker's
        temporary folder, or --out itself)."""
        argv = [sys.executable, "-m", "quantstudy.cli", "run", self.model]
        argv += ["--weights", self.weights, "--data", self.data]
        argv += ["--recipe", self.recipe_arg(folder)]
        for flag, value in (
            ("--calib-data", self.calib_data),
            ("--class-list", self.class_list),
            ("--strip-prefix", self.strip_prefix),
            ("--policy", self.policy),
        ):
            if value is not None:
                argv += [flag, value]
        argv += ["--calib", str(self.calib), "--heldout", str(self.heldout)]
        argv += ["--seed", str(self.seed), "--device", self.device]
        argv += ["--batches", ",".join(str(b) for b in self.batches)]
        argv += ["--compile-mode", self.compile_mode, "--fp8-kernel", self.fp8_kernel]
        if not self.speed:
            argv.append("--no-speed")
        if self.test_settings:
            argv.append("--test-settings")
        return [*argv, "--out", "."]


def expand(spec: SweepSpec, device: str) -> list[GridPoint]:
    """The grid, in the order models x recipes x calibrators x seeds x kernels."""
    points = []
    for m in spec.models:
        recipes = [
            default_recipe_for(m.name) if r == DEFAULT_RECIPE else r
            for r in (m.recipes or spec.recipes)
        ]
        for recipe, calibrator, seed, kernel in itertools.product(
            dict.fromkeys(recipes), spec.calibrators or [None], spec.seeds, spec.fp8_kernels
        ):
            points.append(
                GridPoint(
                    model=m.name,
                    weights=m.weights,
                    strip_prefix=m.strip_prefix,
                    recipe=recipe,
                    recipe_sha256=_file_sha256(recipe),
                    calibrator=calibrator,
                    seed=seed,
                    fp8_kernel=str(kernel),
                    data=spec.data,
                    calib_data=spec.calib_data,
                    class_list=spec.class_list,
                    calib=spec.calib,
                    heldout=spec.heldout,
                    batches=list(spec.batches),
                    policy=spec.policy,
                    device=device,
                    compile_mode=str(spec.compile_mode),
                    speed=spec.speed,
                    test_settings=spec.test_settings,
                )
            )
    names = [p.folder_name for p in points]
    if len(set(names)) != len(names):
        raise UserError("two grid points have the same settings; list each value once")
    return points


def _file_sha256(recipe: str) -> str | None:
    """Hash of a recipe file, so editing it gives new folders; None for a built-in name (a
    missing file fails in its study, recorded there)."""
    path = Path(recipe)
    if not (path.is_absolute() and path.is_file()):
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()
