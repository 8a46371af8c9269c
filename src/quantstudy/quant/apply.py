"""Put a resolved recipe into a model: real FP8 layers for an engine, or the fp32 emulation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantstudy.quant.calibrate import Calibration
from quantstudy.quant.fused import FusedFP8Matmul
from quantstudy.quant.fused_conv import FusedFP8Conv2d, kxk_fp8_blocker
from quantstudy.quant.modules import QDQ, FP8Matmul, real_fp8_blocker
from quantstudy.record.vocab import Fp8Kernel, choices


@dataclass(frozen=True)
class QuantPlan:
    """What to quantize and how: the selected layers, weight granularity, activation scales."""

    layers: list[str]
    per_channel: bool
    calibration: Calibration
    bias_correction: bool = False  # `quant/bias_correction.py`, from the recipe's weights


@dataclass(frozen=True)
class Applied:
    """Which layers ended up real FP8 and which emulated (with the reason)."""

    real: list[str]
    emulated: list[tuple[str, str]]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` of `model` is."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def fp8_blocker(layer: nn.Module, kernel: str = "scaled_mm") -> str | None:
    """Why `layer` cannot run real FP8 with `kernel`; None when it can. The fused kernel also
    runs dense kxk convs (`quant/fused_conv.py`); torch._scaled_mm has no conv."""
    blocker = real_fp8_blocker(layer)
    if blocker is not None and kernel == "fused" and isinstance(layer, nn.Conv2d):
        if kxk_fp8_blocker(layer) is None:
            return None
    return blocker


def real_layers(model: nn.Module, layers: list[str], kernel: str = "scaled_mm") -> list[str]:
    """The layers of `layers` that can run a real FP8 product with `kernel`."""
    return [n for n in layers if fp8_blocker(model.get_submodule(n), kernel) is None]


def fp8_module(
    layer: nn.Module,
    x_scale: float,
    per_channel: bool,
    dtype: torch.dtype,
    kernel: str,
    *,
    act: str = "none",
    out_scale: float | None = None,
    fp8_input: bool = False,
) -> tuple[nn.Module, str | None]:
    """The module an FP8 engine puts in `layer`'s place, and why it is emulated (None: it runs a
    real FP8 product). The one place that chooses it: engines and per-layer timing alike.

    `kernel` "fused": `FusedFP8Matmul` (linears, 1x1 convs) or `FusedFP8Conv2d` (dense kxk
    convs), with `act` in the epilogue and, given `out_scale`, writing the next layer's FP8 input
    (`fp8_input`: reading its own that way); otherwise `FP8Matmul` (torch._scaled_mm). A layer
    no FP8 kernel takes gets the quantize-dequantize `QDQ` in `dtype`."""
    blocker = fp8_blocker(layer, kernel)
    if blocker is not None:
        return QDQ(layer, x_scale, True, per_channel, dtype), blocker
    if kernel != "fused":
        return FP8Matmul(layer, x_scale, per_channel, dtype), None
    fused = FusedFP8Matmul if real_fp8_blocker(layer) is None else FusedFP8Conv2d
    return fused(layer, x_scale, per_channel, dtype, act, out_scale, fp8_input), None


def apply_fp8(
    model: nn.Module,
    source: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    kernel: str = "scaled_mm",
    epilogue: dict[str, str] | None = None,
    handoff: dict[str, str] | None = None,
) -> Applied:
    """Swap the plan's layers of `model` (already in `dtype`) for FP8 modules built from `source`.

    `source` is the float32 model with the same structure (BatchNorm folded when the recipe folds),
    so weight scales come from full-precision weights, not from their fp16 copies. `kernel`
    "fused" builds `FusedFP8Matmul` layers with the activations of `epilogue` (layer -> name)
    in their epilogue; the caller has removed those activation modules from `model`. `handoff`
    (producer -> consumer, `quant/handoff.py`) makes each producer write its consumer's FP8
    input and the consumer read it as is.
    """
    if kernel not in choices(Fp8Kernel):
        raise ValueError(f"FP8 kernel must be one of {choices(Fp8Kernel)}, not {kernel!r}")
    epilogue = epilogue or {}
    handoff = handoff or {}
    if handoff and kernel != "fused":
        raise ValueError("FP8 hand-offs need the fused kernel")
    consumers = set(handoff.values())
    real: list[str] = []
    emulated: list[tuple[str, str]] = []
    for name in plan.layers:
        nxt = handoff.get(name)
        new, blocker = fp8_module(
            source.get_submodule(name),
            plan.calibration.scale_of(name),
            plan.per_channel,
            dtype,
            kernel,
            act=epilogue.get(name, "none"),
            out_scale=plan.calibration.scale_of(nxt) if nxt is not None else None,
            fp8_input=name in consumers,
        )
        replace_module(model, name, new)
        if blocker is None:
            real.append(name)
        else:
            emulated.append((name, blocker))
    return Applied(real, emulated)


def apply_fake_quant(
    model: nn.Module, plan: QuantPlan, weights: bool = True, activations: bool = True
) -> Applied:
    """Swap the plan's layers of the float32 `model` for quantize-dequantize emulations."""
    for name in plan.layers:
        layer = model.get_submodule(name)
        x_scale = plan.calibration.scale_of(name) if activations else None
        replace_module(model, name, QDQ(layer, x_scale, weights, plan.per_channel, torch.float32))
    return Applied([], [(n, "fake-quant emulation in fp32") for n in plan.layers])
