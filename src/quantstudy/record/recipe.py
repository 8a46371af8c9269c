"""The recipe resolved against the model, and the calibrated activation scales."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from quantstudy.record.base import Section
from quantstudy.record.vocab import WeightGranularity


class LayerDecision(Section):
    name: str
    op: Literal["conv2d", "linear"]
    module_class: str
    kernel: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    groups: int = 1
    in_channels: int
    out_channels: int
    input_hw: tuple[int, int] | None = None  # spatial size seen in the calibration forward pass
    selected: bool
    rule: int | None = None  # index of the deciding rule; None: no rule matched (default off)
    reason: str


class RecipeInfo(Section):
    name: str
    source: str  # "builtin:<name>" or a file path
    sha256: str
    description: str
    format: str
    weight_granularity: WeightGranularity
    fold_bn: bool
    bias_correction: bool = False  # version 3
    rounding: str = "nearest"  # version 6: FP8 weight rounding, nearest | compensating
    # version 11: compensating rounding's scale candidates per channel and refinement sweeps
    scale_candidates: int = 1
    refine_sweeps: int = 0
    # version 7 as `sequential`, `propagated` since 26: weights and biases fitted by the
    # propagated fit (`quant/fitting/propagated.py`); an older record's key is still read
    propagated: bool = Field(False, validation_alias=AliasChoices("propagated", "sequential"))
    # version 9: output tuning against the fp32 logits (none | bias | scale_bias) and its epochs
    tune: str = "none"
    tune_epochs: int | None = None
    calibrator: str
    calibrator_params: dict[str, float]
    # version 6: per_tensor (static) | per_row (dynamic); layer -> calibrator overrides;
    # scale migration (none | smooth) and its alpha
    activation_granularity: str = "per_tensor"
    per_row_max_channels: int | None = None  # version 10: per-row scales only on inputs this narrow
    layer_calibrators: dict[str, str] = Field(default_factory=dict)
    migration: str = "none"
    migration_alpha: float | None = None
    headroom: float = 1.0  # version 11: static scales are the calibrator's amax x this / 448
    # version 27: the GELU forms an FP8 layer may compute, "any" (a backend's own, cuBLASLt's
    # tanh) or "erf"; before it, every recipe allowed any
    gelu: str = "any"
    selected: list[LayerDecision]
    excluded: list[LayerDecision]
    counts: dict[str, int]  # e.g. {"selected.conv2d.1x1": 54, "excluded.conv2d.depthwise": 45}


class TensorScale(Section):
    tensor: str  # name of the first consumer's input, e.g. "blocks.1.0.conv_pw:input"
    consumers: list[str]
    amax: float
    scale: float
    # Per-channel mean of the tensor over the calibration images, recorded when the recipe asks
    # for weight bias correction (version 3), so a search can rebuild the correction.
    channel_mean: list[float] | None = None
    calibrator: str | None = None  # version 6: set where a layer override replaced the recipe's


class CalibrationInfo(Section):
    calibrator: str
    params: dict[str, float]
    n_images: int
    tensors: list[TensorScale]
