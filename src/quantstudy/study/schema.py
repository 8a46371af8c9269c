"""The study record (`study.json`): typed, frozen, versioned.

Every number in a report is a field here; the Markdown renderer reads nothing else. Each pipeline
stage produces its own section model, and `StudyRecord` composes them.

Schema history:
  1 (0.1.0): first version.
  2: sensitivity, layer_speed and search sections; Variant.predicted/measured.
  3: EngineInfo.fp8_kernel and EngineInfo.fp8_epilogue (the fused FP8 kernel);
     StudyConfigRecord.fp8_kernel; RecipeInfo.bias_correction; TensorScale.channel_mean.
  4: EngineInfo.fp8_handoff (FP8 layers that write the next FP8 layer's input).
  5: EngineInfo.fp8_scaled_mm_output (what torch._scaled_mm wrote in an unfused engine).

Every field added since version 1 is optional, so version-1 files still load (`report/render.py`
reads every version up to `SCHEMA_VERSION`); a record keeps the version it was written with.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 5
OLDEST_SCHEMA_VERSION = 1  # the oldest version this code still reads


class Section(BaseModel):
    """Base of every record section: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# --- environment and inputs ---------------------------------------------------------------


class Environment(Section):
    python: str
    platform: str
    cpu: str
    cpu_count: int
    torch_threads: int
    torch: str
    timm: str
    numpy: str
    cuda: str | None = None
    cudnn: str | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    gpu_capability: str | None = None
    quantstudy: str
    git_commit: str | None = None
    created_utc: str


class ModelInfo(Section):
    name: str  # as given, e.g. "mobilenetv4_conv_large.e500_r256_in1k"
    architecture: str  # timm architecture, e.g. "mobilenetv4_conv_large"
    pretrained_tag: str | None = None
    weights: Literal["file", "cache", "random", "named"]
    weights_detail: str  # file path, cache id, named source, or "random init, seed N"
    weights_sha256: str | None = None
    random_weights: bool
    seed: int
    num_params: int
    num_classes: int


class Preprocessing(Section):
    input_size: tuple[int, int, int]
    crop_pct: float
    crop_mode: str
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    settings: Literal["train", "test"]  # which of the pretrained config's sizes was used
    source: str  # where the values came from, e.g. "pretrained_cfg of tf_efficientnet_lite0.in1k"


class SkippedImage(Section):
    id: str
    reason: str


class ImageSet(Section):
    role: Literal["calibration", "heldout"]
    folder: str
    labelled: bool
    n_images: int
    n_classes: int | None = None  # None when unlabelled
    per_class_min: int | None = None
    per_class_max: int | None = None
    ids_sha256: str
    ids: list[str]


class DataInfo(Section):
    data_dir: str
    calib_dir: str | None = None
    class_list: str | None = None
    labelled: bool
    seed: int
    skipped: list[SkippedImage]
    calibration: ImageSet
    heldout: ImageSet


# --- recipe and calibration ---------------------------------------------------------------


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
    weight_granularity: Literal["per_channel", "per_tensor"]
    fold_bn: bool
    bias_correction: bool = False  # version 3
    calibrator: str
    calibrator_params: dict[str, float]
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


class CalibrationInfo(Section):
    calibrator: str
    params: dict[str, float]
    n_images: int
    tensors: list[TensorScale]


# --- engines ------------------------------------------------------------------------------


class EngineInfo(Section):
    name: str  # "fp32", "fp16", "fp8", "fakequant", "fakequant_weights", ...
    compute_dtype: str
    device: str
    compiled: bool
    compile_mode: str | None = None
    cuda_graphs: bool = False
    channels_last: bool = False
    fp8_real: list[str]  # layers running a real FP8 matrix product
    fp8_emulated: list[str]  # layers quantized but computed by quantize-dequantize
    # Which FP8 product ran the real layers: "fused" (Triton on CUDA, torch on CPU) or
    # "scaled_mm" (torch._scaled_mm plus a separate cast/bias pass); None: no real FP8 layer.
    fp8_kernel: str | None = None
    fp8_epilogue: dict[str, str] = Field(default_factory=dict)  # layer -> absorbed activation
    # producer -> consumer: the producer writes the consumer's FP8 input (schema 4 on)
    fp8_handoff: dict[str, str] = Field(default_factory=dict)
    # "scaled_mm" engines: the output torch._scaled_mm wrote, e.g. "float16, bias in its
    # epilogue" (`quant.modules.scaled_mm_output`); None otherwise (schema 5 on)
    fp8_scaled_mm_output: str | None = None
    fp16_layers: int  # conv/linear layers left in the engine's compute dtype
    weight_bytes: int
    numerics: dict[str, str]  # explicit global settings, e.g. {"allow_tf32": "False"}


# --- quality ------------------------------------------------------------------------------


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
    meaningful: bool  # False with random weights: agreement/KL still measured, accuracy is not
    meaningless_reason: str | None = None


# --- speed --------------------------------------------------------------------------------


class TimingStats(Section):
    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int


class BatchSpeed(Section):
    batch: int
    fp16_ms: TimingStats
    fp8_ms: TimingStats
    ratio: TimingStats  # x = fp16 / fp8, per round pair
    warnings: list[str]


class KernelGroupTime(Section):
    group: Literal["fp8_matmul", "fp16_matmul_conv", "depthwise_conv", "quantize_convert", "other"]
    time_us: float
    count: int


class KernelBreakdown(Section):
    engine: str
    batch: int
    kernel_count: int
    total_us: float
    groups: list[KernelGroupTime]
    top_kernels: list[tuple[str, float]]  # (name, us) of the largest kernels, for the reader


class SpeedSection(Section):
    device: str
    meaningful: bool  # False on CPU: timings are not evidence for the decision
    meaningless_reason: str | None = None
    compile_mode: str
    timed_region: str
    rounds: int
    iters_per_round: int
    warmup: int
    input_buffers: int
    clocks: dict[str, str]
    batches: list[BatchSpeed]
    kernels: list[KernelBreakdown]
    weight_bytes: dict[str, int]
    package_bytes: dict[str, int] | None = None


# --- per-layer sensitivity, per-layer speed and the recipe search (`quantstudy search`) ----

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
    fp8_path: Literal["real", "emulated"] | None = None  # emulated: no FP8 kernel, Q/DQ in fp16
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
    compile_mode: str | None = None
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


# --- decision and variants ----------------------------------------------------------------


class Gate(Section):
    name: str
    kind: Literal["speed", "quality"]
    threshold: str
    measured: str
    passed: bool
    skipped_reason: str | None = None


class Decision(Section):
    ship: bool
    policy: str  # policy file or "builtin:default"
    gates: list[Gate]
    failed: list[str]
    summary: str

    def __bool__(self) -> bool:
        return self.ship


class Variant(Section):
    """A recipe variant studied next to the main recipe (e.g. weight-only, no layer1)."""

    name: str
    recipe: str
    selected_count: int
    quality: EngineQuality | None = None
    speed: list[BatchSpeed] | None = None
    predicted: SearchPrediction | None = None  # the additive model's prediction for this recipe
    measured: Measured | None = None  # what this recipe's own study measured


class StudyConfigRecord(Section):
    model: str
    weights: str
    data: str
    calib_data: str | None = None
    recipe: str
    calib: int
    heldout: int
    seed: int
    device: str
    batches: list[int]
    compile_mode: str
    fp8_kernel: str | None = None  # None in records before version 3: they ran "scaled_mm"
    test_settings: bool
    policy: str


class StudyRecord(Section):
    schema_version: int = SCHEMA_VERSION
    name: str
    status: Literal["complete", "partial"]
    config: StudyConfigRecord
    environment: Environment
    model: ModelInfo
    preprocessing: Preprocessing
    data: DataInfo
    recipe: RecipeInfo | None = None
    calibration: CalibrationInfo | None = None
    engines: list[EngineInfo] = []
    quality: QualitySection | None = None
    speed: SpeedSection | None = None
    decision: Decision | None = None
    variants: list[Variant] = []
    sensitivity: SensitivitySection | None = None
    layer_speed: LayerSpeedSection | None = None
    search: SearchSection | None = None
    not_run: list[str] = []  # plain statements of what this study did not measure
