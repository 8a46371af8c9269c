"""Per-layer sensitivity, per-layer speed and the recipe search (`quantstudy search`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quantstudy.record.base import Section
from quantstudy.record.speed import TimingStats
from quantstudy.record.vocab import CompileMode, FP8Path

Mode = Literal["only", "all_but"]


class LayerSensitivity(Section):
    """One candidate layer: the fake-quant model with only it quantized (and all but it)."""

    layer: str
    kind: str  # conv2d.1x1, conv2d.depthwise, conv2d.grouped, conv2d.kxk or linear
    rank: int  # 1: the most sensitive layer (largest KL mean with only this layer quantized)
    kl_mean: float  # KL(fp32 || only this layer quantized), mean over the subset, nats
    kl_max: float
    agreement: float  # top-1 agreement with fp32, only this layer quantized
    differ_count: int
    all_but_kl_mean: float | None = None  # every candidate quantized except this one
    all_but_agreement: float | None = None
    all_but_differ_count: int | None = None


class SensitivitySection(Section):
    reference: str  # "fp32": the unfolded float32 model, as in the study's quality section
    n_images: int
    subset: str  # which held-out images, in words
    ids_sha256: str | None = None  # hash of the subset's image ids, when they come from a study
    modes: list[Mode]
    ranked_by: str
    all_kl_mean: float  # every candidate layer quantized, on the same subset
    all_agreement: float
    layers: list[LayerSensitivity]  # in rank order


class LayerSpeed(Section):
    """fp16 against FP8 time of one layer's own operation at its real input shape and batch."""

    layer: str
    kind: str | None = None  # None when the gains come from a plain gains file
    batch: int
    input_shape: list[int] | None = None
    fp8_path: FP8Path | None = None  # emulated: no FP8 kernel, Q/DQ in fp16
    rank: int  # 1: the largest saving
    saved_ms: float  # fp16 median - FP8 median; negative when FP8 is slower
    fp16_ms: TimingStats | None = None  # None when the gains come from a plain gains file
    fp8_ms: TimingStats | None = None
    ratio: TimingStats | None = None  # x = fp16 / FP8 per round pair
    warnings: list[str] = Field(default_factory=list)


class LayerSpeedSection(Section):
    source: Literal["measured", "file"]
    source_detail: str  # device name, or the gains file path
    meaningful: bool  # False for a gains file: numbers the study did not measure itself
    batch: int
    compile_mode: CompileMode | None = None
    timed_region: str | None = None
    rounds: int | None = None
    iters_per_round: int | None = None
    warmup: int | None = None
    layers: list[LayerSpeed]  # in rank order


class SearchBudget(Section):
    """The quality budget, from the decision policy, and the share the prediction may use."""

    policy: str
    max_kl_mean: float  # policy.quality.max_kl_mean
    min_agreement: float  # policy.quality.min_agreement
    margin: float  # fraction of the policy's budget the additive prediction may spend
    kl_budget: float  # margin * max_kl_mean
    disagreement_budget: float  # margin * (1 - min_agreement)


class LayerChoice(Section):
    layer: str
    chosen: bool
    reason: str
    kl_mean: float
    disagreement: float  # 1 - agreement with only this layer quantized
    saved_ms: float


class SearchPrediction(Section):
    """What the additive model predicts for a set of layers (the chosen one, or all candidates)."""

    layers: list[str]
    batch: int
    saved_ms: float  # sum of per-layer savings
    kl_mean: float  # sum of per-layer KL means: the additive quality proxy
    agreement: float  # 1 - sum of per-layer disagreements, at least 0
    fp16_ms: float | None = None  # whole-model fp16 median at `batch`, from the candidate study
    fp8_ms: float | None = None  # fp16_ms - saved_ms
    speedup: float | None = None  # fp16_ms / fp8_ms


class Measured(Section):
    """The figures a real study measured for a recipe, to set beside a prediction."""

    study: str  # study folder
    recipe: str
    n_layers: int
    kl_mean: float  # FP8 engine against fp32, whole held-out set
    agreement: float
    fakequant_kl_mean: float | None = None  # the recipe's fp32 emulation, same images
    fakequant_agreement: float | None = None
    batch: int | None = None
    fp16_ms: float | None = None
    fp8_ms: float | None = None
    speedup: float | None = None  # median of the per-round ratio x = fp16 / FP8
    speed_meaningful: bool = False
    ship: bool | None = None


class OptionStep(Section):
    """One FP8 quality option the search tried (`search/options.py`), on the sensitivity subset
    with every candidate layer emulated: its KL mean and agreement against fp32, its paired KL
    change, whether it was kept, and its share of the options' total KL decrease (kept options
    only)."""

    option: str
    kl_mean: float
    agreement: float
    kept: bool
    share: float | None = None
    # The paired change in KL mean against the options kept before it, with its 95% bootstrap
    # interval; kept when the interval lies below zero (schema 12 on; None: the first step, or
    # a search that kept any decrease).
    kl_change: float | None = None
    kl_change_low: float | None = None
    kl_change_high: float | None = None


class SearchSection(Section):
    candidate_recipe: str
    method: str  # how the subset was picked, and what is approximate about it
    budget: SearchBudget
    choices: list[LayerChoice]
    predicted: SearchPrediction  # the chosen layers
    candidate_predicted: SearchPrediction  # every candidate layer, as a check of the model
    candidate_measured: Measured | None = None
    recipe_file: str | None = None
    verified: Measured | None = None  # the chosen recipe's own study
    options: list[OptionStep] | None = None  # version 6: the option step, in the order tried
