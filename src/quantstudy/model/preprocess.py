"""Preprocessing resolved through timm, recorded value by value.

Quality numbers are only comparable when the exact resize, crop and normalisation are known, so
the resolved values go into the study record and the transform is built from that record alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import timm.data
import torch
from PIL import Image
from torch import nn

from quantstudy.record import Preprocessing


def resolve_preprocessing(
    model: nn.Module, test_settings: bool = False, source: str | None = None
) -> Preprocessing:
    """Resolve the model's eval preprocessing from its timm pretrained config.

    `test_settings` picks the config's test_input_size / test_crop_pct where it has them; where it
    lacks them the train values are used and `source` says so.
    """
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    data = timm.data.resolve_model_data_config(model, use_test_size=test_settings)
    if source is None:
        arch = cfg.get("architecture") or type(model).__name__
        tag = cfg.get("tag")
        source = f"pretrained_cfg of {arch}.{tag}" if tag else f"pretrained_cfg of {arch}"
        if not cfg:
            source = f"timm defaults (model {type(model).__name__} has no pretrained_cfg)"
    used_test = False
    if test_settings:
        absent = [k for k in ("test_input_size", "test_crop_pct") if not cfg.get(k)]
        used_test = len(absent) < 2
        if absent:
            source += f"; test settings asked, config lacks {', '.join(absent)}: train values used"
    channels, height, width = (int(v) for v in data["input_size"])
    return Preprocessing(
        input_size=(channels, height, width),
        crop_pct=float(data["crop_pct"]),
        crop_mode=str(data["crop_mode"]),
        interpolation=str(data["interpolation"]),
        mean=tuple(float(v) for v in data["mean"]),
        std=tuple(float(v) for v in data["std"]),
        settings="test" if used_test else "train",
        source=source,
    )


class EvalTransform:
    """PIL image -> float32 CHW tensor; a class (not a closure) so it pickles for workers."""

    def __init__(self, pre: Preprocessing) -> None:
        self.pre = pre
        self._transform = timm.data.create_transform(
            input_size=pre.input_size,
            is_training=False,
            interpolation=pre.interpolation,
            mean=pre.mean,
            std=pre.std,
            crop_pct=pre.crop_pct,
            crop_mode=pre.crop_mode,
        )

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self._transform(image.convert("RGB")).to(torch.float32)

    @property
    def steps(self) -> list[Callable[..., Any]]:
        """timm's transform steps in order (the streamed held-out pass splits them)."""
        return list(self._transform.transforms)


def build_transform(pre: Preprocessing) -> Callable[[Image.Image], torch.Tensor]:
    """The eval transform exactly as recorded in `pre` (timm's create_transform)."""
    return EvalTransform(pre)
