"""The engines of one study, each built lazily, in the order a study runs them.

One table, read by a full study (every engine, `quality_stage.py: build_engines`) and by a
speed-only study (the two timed engines, `speed_only.py`), so both build the fp16 and FP8 engines
alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.engines.builders import build_fakequant, build_fp8, build_fp32, build_half
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import FP8Layout, StudyConfig
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import Engine as EngineName

# Quality engines beyond the reference: name -> (fake-quant weights, fake-quant activations).
ATTRIBUTION = {
    EngineName.FAKEQUANT: (True, True),
    EngineName.FAKEQUANT_WEIGHTS: (True, False),
    EngineName.FAKEQUANT_ACTIVATIONS: (False, True),
}

Builder = Callable[[FP8Layout], Engine]
"""Builds one engine of the study, given the layout of the study's FP8 engine (empty where none
is built yet): the emulations leave float the layers it kept in fp16."""


def study_builders(
    config: StudyConfig,
    model: nn.Module,
    example: torch.Tensor,
    plan: QuantPlan,
    fold: bool,
    device: torch.device,
    spec: BuildSpec,
) -> dict[str, Builder]:
    """Every engine of the study, built lazily, in the order they run (the FP8 engine before
    its emulations, which take its layout). `spec`: what the FP8 engine computes
    (`StudyConfig.build_spec`; with a recorded per-layer kernel choice, rebuilt as it was by
    `quantstudy extend`, not timed again)."""
    mode = config.compile_mode

    def fp8(_: FP8Layout) -> Engine:
        return build_fp8(model, device, example, plan, fold=fold, compile_mode=mode, spec=spec)

    def fakequant(name: str, weights: bool, activations: bool, like: FP8Layout) -> Engine:
        return build_fakequant(
            model,
            device,
            example,
            plan,
            fold=fold,
            weights=weights,
            activations=activations,
            name=name,
            like=like,
        )

    return {
        EngineName.FP32: lambda _: build_fp32(model, device),
        EngineName.FP16: lambda _: build_half(model, device, example, fold=fold, compile_mode=mode),
        EngineName.FP8: fp8,
        **{name: functools.partial(fakequant, name, w, a) for name, (w, a) in ATTRIBUTION.items()},
    }
