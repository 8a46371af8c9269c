"""Module replacement in a model, by qualified name.

Every rewrite and fit that swaps a float layer for an FP8 one (or back) goes through here, so
the stages that swap modules need not import the plan that orders them.
"""

from __future__ import annotations

from torch import nn


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` of `model` is."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
