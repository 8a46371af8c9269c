"""The engines of one study, each built lazily, in the order a study runs them.

One table, read by a full study (every engine, `run.py: build_engines`) and by a speed-only
study (the two timed engines, `speed_only.py`), so both build the fp16 and FP8 engines alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.engines.builders import build_fakequant, build_fp8, build_fp32, build_half
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.study.config import StudyConfig

# Quality engines beyond the reference: name -> (fake-quant weights, fake-quant activations).
ATTRIBUTION = {
    EngineName.FAKEQUANT: (True, True),
    EngineName.FAKEQUANT_WEIGHTS: (True, False),
    EngineName.FAKEQUANT_ACTIVATIONS: (False, True),
}


def study_builders(
    config: StudyConfig,
    model: nn.Module,
    example: torch.Tensor,
    plan: QuantPlan,
    fold: bool,
    device: torch.device,
) -> dict[str, Callable[[], Engine]]:
    """Every engine of the study, built lazily, in the order they run."""
    mode = config.compile_mode
    return {
        EngineName.FP32: lambda: build_fp32(model, device),
        EngineName.FP16: lambda: build_half(model, device, example, fold=fold, compile_mode=mode),
        EngineName.FP8: lambda: build_fp8(
            model,
            device,
            example,
            plan,
            fold=fold,
            compile_mode=mode,
            kernel=config.kernel,
            choice_batches=config.batches,
        ),
        **{
            name: functools.partial(
                build_fakequant,
                model,
                device,
                example,
                plan,
                fold=fold,
                weights=w,
                activations=a,
                name=name,
            )
            for name, (w, a) in ATTRIBUTION.items()
        },
    }
