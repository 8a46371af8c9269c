"""Quality of each engine against the fp32 reference on the held-out set."""

from __future__ import annotations

from quantstudy.record.base import Section


class MeanInterval(Section):
    """A bootstrap percentile interval on a mean, at one confidence level."""

    level: float
    low: float
    high: float


class EngineQuality(Section):
    engine: str
    n_images: int
    labelled: bool
    top1: float | None = None
    top5: float | None = None
    top1_reference: float | None = None
    top5_reference: float | None = None
    agreement: float
    differ_count: int
    gained: int | None = None  # reference wrong, engine right
    lost: int | None = None  # reference right, engine wrong
    wrong_to_wrong: int | None = None  # both wrong, different classes
    net_change: int | None = None  # gained - lost
    top1_change: float | None = None  # engine top1 - reference top1
    ci_low: float | None = None  # paired bootstrap 95% CI on top1_change
    ci_high: float | None = None
    ci_level: float | None = None  # e.g. 0.95
    bootstrap_resamples: int | None = None
    bootstrap_seed: int | None = None
    mcnemar_p: float | None = None
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    max_abs_logit_diff: float
    kl_histogram: list[int]  # counts over kl_bin_edges, for the KL plot
    kl_bin_edges: list[float]
    # Bootstrap intervals on kl_mean at a few levels (the decision picks its policy's); the
    # per-image values they need are not kept in the record.
    kl_mean_intervals: list[MeanInterval] | None = None


class NonFiniteScan(Section):
    engine: str
    heldout_checked: int
    stress_checked: int
    nonfinite_heldout: list[str]  # image ids with a NaN/Inf logit
    nonfinite_stress: list[str]  # stress input names with a NaN/Inf logit


class EmulationGap(Section):
    """FP8 engine against its own fake-quant emulation: recipe loss vs engine loss."""

    agreement: float
    differ_count: int
    kl_mean: float
    kl_max: float
    # The emulation against itself with only its fp32 summation order changed (channels-last):
    # FP8 rounding amplifies such reassociation, so no distinct kernel can agree better.
    floor_agreement: float | None = None
    floor_differ_count: int | None = None
    floor_kl_mean: float | None = None
    # Against fp32 (schema 12 on): images the FP8 engine alone differs on, those its emulation
    # alone differs on, and McNemar's exact p on that split.
    engine_only_differ: int | None = None
    emulation_only_differ: int | None = None
    split_mcnemar_p: float | None = None
    # The same FP8 engine built in float32 against the emulation (schema 12 on; a study run
    # with `float32_engine`): its FP8 arithmetic without half-precision storage between layers.
    float32_agreement: float | None = None
    float32_differ_count: int | None = None
    float32_kl_mean: float | None = None
    # The emulation with its stored values rounded to the engine's half dtype (schema 13 on,
    # `engines.run.run_half_storage`): the floor for an engine storing in that dtype.
    half_floor_dtype: str | None = None
    half_floor_agreement: float | None = None
    half_floor_differ_count: int | None = None
    half_floor_kl_mean: float | None = None
    # The floor's reordered run split against the emulation the same way (schema 13 on): how
    # uneven a split two equally correct computations of the recipe give.
    floor_only_differ: int | None = None
    floor_emulation_only_differ: int | None = None
    floor_split_mcnemar_p: float | None = None


class QualitySection(Section):
    reference: str  # "fp32"
    engines: list[EngineQuality]  # fp16, fp8, fakequant, fakequant_weights, fakequant_activations
    emulation_gap: EmulationGap | None = None
    nonfinite: list[NonFiniteScan]
    stress_inputs: list[str]
    n_classes: int | None = None
    per_class_min: int | None = None
    per_class_max: int | None = None
    warnings: list[str]
    # The FP8 engine scored with the fp16 engine as the reference (paired counts, agreement,
    # KL), for decision gates whose baseline is fp16.
    against_fp16: EngineQuality | None = None
    meaningful: bool  # False with random weights: agreement/KL still measured, accuracy is not
    meaningless_reason: str | None = None
