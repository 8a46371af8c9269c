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
from quantstudy.record import LayerKernel
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.record.vocab import FP8Kernel
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
    fp8_choice: list[LayerKernel] | None = None,
) -> dict[str, Callable[[], Engine]]:
    """Every engine of the study, built lazily, in the order they run. `fp8_choice`: the
    per-layer kernel choice a "fastest" study recorded, rebuilt as it was (`quantstudy
    extend`), not timed again.

    The emulations are built after the FP8 engine and leave float the layers it stepped aside
    (`engines/step_aside.py`), so the FP8 engine against its emulation compares like with like;
    where the FP8 engine is not built (the caller runs other engines only), they emulate every
    layer of the plan."""
    mode = config.compile_mode
    stepped: list[str] = []  # set when the FP8 engine is built

    def fp8() -> Engine:
        engine = build_fp8(
            model,
            device,
            example,
            plan,
            fold=fold,
            compile_mode=mode,
            kernel=config.kernel,
            choice_batches=config.batches,
            replay=fp8_choice if config.kernel == FP8Kernel.FASTEST else None,
        )
        stepped[:] = engine.fp8_stepped_aside
        return engine

    def fakequant(name: str, weights: bool, activations: bool) -> Engine:
        return build_fakequant(
            model,
            device,
            example,
            plan,
            fold=fold,
            weights=weights,
            activations=activations,
            name=name,
            stepped_aside=list(stepped),
        )

    return {
        EngineName.FP32: lambda: build_fp32(model, device),
        EngineName.FP16: lambda: build_half(model, device, example, fold=fold, compile_mode=mode),
        EngineName.FP8: fp8,
        **{name: functools.partial(fakequant, name, w, a) for name, (w, a) in ATTRIBUTION.items()},
    }
