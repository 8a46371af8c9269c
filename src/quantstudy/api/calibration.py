"""The calibration images `quantize` takes, in any of four forms, as the batches a plan reads.

- a folder of images: the images a study with `--calib-data FOLDER --calib N --seed S` takes
  (`data/split.py: split_items`), decoded and preprocessed as the study does (`data/images.py`,
  the model's timm preprocessing), in batches of `eval_batch`, as the study calibrates;
- a tensor of preprocessed images (N, C, H, W), in batches of `eval_batch`;
- an iterable of such batches (a DataLoader's `(images, labels)` pairs give their images);
- a callable that runs the model itself, ModelOpt's `forward_loop(model)`: it runs once, and
  the inputs it feeds the model are what calibration reads.

Every form ends as a list of CPU tensors, checked once: a plan may read its images more than
once (scale migration calibrates again, the propagated fit and output tuning run the model over
them), and a generator or a forward loop can be run only once, so they are kept. Calibration
sets are small (hundreds of images); the study holds its own the same way (`Prepared.calib_x`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeAlias

import torch
from torch import nn

from quantstudy.record import Preprocessing
from quantstudy.record.errors import UserError

Calibration: TypeAlias = str | Path | torch.Tensor | Iterable[Any] | Callable[[nn.Module], object]
"""What `quantize(calibration=...)` takes (module docstring)."""


def calibration_batches(
    calibration: Calibration,
    model: nn.Module,
    pre: Preprocessing,
    *,
    calib: int,
    seed: int,
    eval_batch: int,
) -> list[torch.Tensor]:
    """`calibration` as CPU float32 batches of `pre.input_size` images (module docstring)."""
    if isinstance(calibration, (str, Path)):
        return _slices(_folder(Path(calibration), pre, calib, seed), eval_batch)
    if isinstance(calibration, torch.Tensor):
        images = _checked([calibration], pre, what="calibration tensor")
        return [part for x in images for part in _slices(x, eval_batch)]
    if isinstance(calibration, nn.Module) or not (
        callable(calibration) or isinstance(calibration, Iterable)
    ):
        raise UserError(
            f"calibration is a {type(calibration).__name__}: give a folder of images, a tensor "
            "of preprocessed images, an iterable of such batches, or a function that runs the "
            "model on them (forward_loop)"
        )
    batches = _captured(calibration, model) if callable(calibration) else list(calibration)
    return _checked([_images(b) for b in batches], pre, what="calibration batch")


def _folder(folder: Path, pre: Preprocessing, calib: int, seed: int) -> torch.Tensor:
    """The images of `folder` a study with `--calib-data folder` calibrates on."""
    from quantstudy.data.folders import scan_folder
    from quantstudy.data.images import load_images
    from quantstudy.data.split import split_items
    from quantstudy.model.preprocess import build_transform
    from quantstudy.study.checks import say_shortfall, say_skipped

    scan = scan_folder(folder)
    say_skipped(scan)
    items, _ = split_items(scan.items, calib, 1, seed=seed)
    say_shortfall("calibration", "--calib", calib, len(items), folder)
    x, _ = load_images(items, build_transform(pre), desc="calibration images")
    return x


def _slices(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [x[i : i + size] for i in range(0, x.shape[0], size)]


def _captured(forward_loop: Callable[[nn.Module], object], model: nn.Module) -> list[torch.Tensor]:
    """Run `forward_loop(model)` once; the first input of every call of the model, kept."""
    seen: list[torch.Tensor] = []

    def keep(_module: nn.Module, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor):
            seen.append(args[0].detach().cpu())

    handle = model.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            forward_loop(model)
    finally:
        handle.remove()
    return seen


def _images(batch: object) -> torch.Tensor:
    """A batch's images: the tensor itself, or the first item of an (images, labels) pair."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if not isinstance(batch, torch.Tensor):
        raise UserError(
            f"calibration batch is a {type(batch).__name__}: each batch must be a tensor of "
            "preprocessed images, or an (images, labels) pair"
        )
    return batch


def _checked(batches: list[torch.Tensor], pre: Preprocessing, what: str) -> list[torch.Tensor]:
    """The batches as float32 on the CPU, each (N, C, H, W) of the model's input size. An empty
    list is left to calibration, which refuses it in the study's words."""
    c, h, w = pre.input_size
    for i, x in enumerate(batches):
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, h, w) or not x.is_floating_point():
            which = what if len(batches) == 1 else f"{what} {i}"
            raise UserError(
                f"{which} is a {str(x.dtype).removeprefix('torch.')} tensor of shape "
                f"{tuple(x.shape)}; the model takes float images of shape (N, {c}, {h}, {w}), "
                f"preprocessed as its timm pretrained_cfg says ({pre.source})"
            )
    return [x.detach().to("cpu", torch.float32) for x in batches if x.shape[0] > 0]
