"""Content checks of a study's inputs: files that parse but would not mean what the study assumes.

Called by the prepare step once the model, the data and the recipe are read, before any heavy
work. Each check either refuses with one line (`UserError`) or says on the console what the study
does instead; what it does is also in the record (the counts used, the skipped files).
"""

from __future__ import annotations

import torch

from quantstudy.data.folders import FolderScan
from quantstudy.recipe.choose import nothing_selected
from quantstudy.recipe.resolve import Resolution
from quantstudy.record.errors import NothingSelected, UserError
from quantstudy.study.cache import console


def require_selection(resolution: Resolution, recipe_source: str, model: str) -> None:
    """A recipe that selects no layer would compare fp16 with fp16 and call it an FP8 study:
    refused, naming the built-in recipes that do select layers of the model."""
    for note in resolution.notes:
        console.print(f"[yellow]recipe {recipe_source}: {note}[/yellow]")
    if resolution.selected:
        return
    candidates = len(resolution.excluded)
    name = recipe_source.removeprefix("builtin:")
    raise NothingSelected(
        f"recipe {recipe_source} selects no layer of {model} ({candidates} candidate layers, "
        f"none included), so there is no FP8 engine to study; "
        f"{nothing_selected(resolution, name)} (why each layer is left out: `quantstudy "
        f"recipes show {name} --model {model}`)"
    )


def say_shortfall(what: str, option: str, asked: int, used: int, folder: object) -> None:
    """Fewer images than asked: the study uses all there are, and says so (the report too)."""
    if used < asked:
        console.print(
            f"[yellow]{option} {asked} asked, but {folder} has {used} {what} images left for "
            f"it: the study uses those {used} (the report's settings say so)[/yellow]"
        )


def say_skipped(scan: FolderScan, shown: int = 3) -> None:
    """Files of a scanned folder the study does not use: one line, their count and the first
    few with their reasons (the record and the report's method section list them all)."""
    if not scan.skipped:
        return
    first = "; ".join(f"{s.id} ({s.reason})" for s in scan.skipped[:shown])
    more = f"; and {len(scan.skipped) - shown} more" if len(scan.skipped) > shown else ""
    console.print(
        f"{scan.root}: {len(scan.skipped)} files skipped, not usable images: {first}{more} "
        "(the report lists each)",
        style="yellow",
        markup=False,  # file names are the user's: a `[` in one is not markup
        highlight=False,
        soft_wrap=True,
    )


def require_class_count(scan: FolderScan, num_classes: int) -> None:
    """A class list of another length than the model's outputs maps folders to wrong labels."""
    if scan.labelled and scan.n_classes != num_classes:
        source = scan.class_list or "timm's ImageNet-1k class list"
        raise UserError(
            f"class list {source} names {scan.n_classes} classes but the model predicts "
            f"{num_classes}: line N of the list must be the model's output N; give the "
            "--class-list the model was trained with"
        )


def require_sound_reference(logits: torch.Tensor, model: str) -> None:
    """The fp32 model is the yardstick every engine is scored against: a NaN/Inf logit, or the
    same logits for every image, is a defect of the model or its weights (a checkpoint that
    did not load, a broken layer), and any FP8 "loss" measured against it would be that
    defect's. Refused before any other engine runs; its logits stay cached for the rerun."""
    bad = ~torch.isfinite(logits)
    if bool(bad.any()):
        images = int(bad.any(dim=1).sum())
        raise UserError(
            f"the fp32 reference of {model} gives NaN/Inf logits on {images} of "
            f"{logits.shape[0]} held-out images: the model itself is broken, not a quantization "
            "to judge; check its weights (--weights) and its checkpoint's preprocessing"
        )
    if logits.shape[0] > 1 and bool((logits == logits[:1]).all()):
        raise UserError(
            f"the fp32 reference of {model} gives the same logits for all {logits.shape[0]} "
            "held-out images: it does not look at its input (a checkpoint that did not load, "
            "or a broken layer), so no engine can be judged against it; check --weights"
        )
