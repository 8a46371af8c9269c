"""A model's family: the one meaning of the word, used for its default recipe
(`recipe/builtin.py: FAMILY_RECIPES`), the zoo's page and its plot.

A family is the timm module that defines the architecture (`timm/models/<family>.py`; timm keeps
one family per module: `vision_transformer` for `vit_tiny_patch16_224`, `xception_aligned` for
`xception41`, `efficientnet` for `mobilenetv2_100`), except where `SPLITS` names a finer family
inside a module, each row with its reason. A name timm does not register is its own family.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """A family inside a timm module: the architectures its globs match."""

    family: str
    globs: tuple[str, ...]
    why: str


# Checked in order, first match wins; an architecture no row matches is its module's family.
SPLITS: tuple[Split, ...] = (
    Split(
        "mobilenetv4",
        ("mobilenetv4_*",),
        "timm defines MobileNetV4 in mobilenetv3.py; its Universal Inverted Bottleneck blocks "
        "have a recipe of their own (mobilenetv4_pointwise) that MobileNetV3 does not take",
    ),
)


def architecture_of(model_name: str) -> str:
    """`timm/mobilenetv4_conv_large.e500_r256_in1k` -> `mobilenetv4_conv_large`."""
    return model_name.rsplit("/", 1)[-1].split(".", 1)[0]


def split_of(model_name: str) -> Split | None:
    """The row of `SPLITS` that names the model's family; None: its module names it."""
    arch = architecture_of(model_name)
    return next((s for s in SPLITS if any(fnmatch.fnmatchcase(arch, g) for g in s.globs)), None)


def timm_module(model_name: str) -> str | None:
    """The timm module that defines the architecture; None for a name timm does not register.
    Imports timm (and torch) on the first call."""
    import timm.models

    arch = architecture_of(model_name)
    if not timm.models.is_model(arch):
        return None
    return str(timm.models.model_entrypoint(arch).__module__).rsplit(".", 1)[-1]


def family_of(model_name: str) -> str:
    """The model's family (module docstring): its `SPLITS` row, else its timm module, else its
    architecture (a name timm does not register)."""
    split = split_of(model_name)
    if split is not None:
        return split.family
    return timm_module(model_name) or architecture_of(model_name)
