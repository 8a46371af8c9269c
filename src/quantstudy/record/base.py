"""The study record (`study.json`): typed, frozen, versioned; the ground every stage writes into.

Every number in a report is a field here; the Markdown renderer reads nothing else. Each pipeline
stage produces its own section model, and `StudyRecord` composes them.

Schema history:
  1 (0.1.0): first version.
  2: sensitivity, layer_speed and search sections; Variant.predicted/measured.
  3: EngineInfo.fp8_kernel and EngineInfo.fp8_epilogue (the fused FP8 kernel);
     StudyConfigRecord.fp8_kernel; RecipeInfo.bias_correction; TensorScale.channel_mean.
  4: EngineInfo.fp8_handoff (FP8 layers that write the next FP8 layer's input).
  5: EngineInfo.fp8_scaled_mm_output (what torch._scaled_mm wrote in an unfused engine).
  6: SpeedSection.ideal (the ideal x per batch size at the FP8 roofline, `speed/ideal.py`).
     SpeedSection.engine/engine_version/layer_precision (TensorRT timings, `import-trt`).
     EngineInfo.fp8_kernel_choice and FP8Kernel "fastest" (per-layer kernel choice).
     StudyConfig (was StudyConfigRecord) holds the whole config: class_list, strip_prefix,
     eval_batch, speed, package, out.
     StudyRecord.timings (wall time per stage of the run, `study/stage_timer.py`).
     StudyRecord.digest (SHA-256 of the sealed sections, checked by `quantstudy report`).
     Typed gates (Gate.status/value/low/high/threshold/baseline; Decision.outcome with
     "inconclusive"; text gates of older records convert on load); EngineQuality
     .kl_mean_intervals; QualitySection.against_fp16.
     FP8 quality options: RecipeInfo.rounding, .activation_granularity, .layer_calibrators,
     .migration, .migration_alpha; TensorScale.calibrator; SearchSection.options (OptionStep).
  7: RecipeInfo.sequential (weights and biases fitted layer by layer to the partly quantized
     network, `quant/fitting/propagated.py`).
  8: EngineInfo.fp8_residual (fused FP8 layers that sum a block's residual in their
     epilogue, `quant/rewrites/residual.py`) and EngineInfo.fp8_sum_handoff (those that also write
     the next FP8 layer's input, `quant/rewrites/sum_handoff.py`).
  9: RecipeInfo.tune and .tune_epochs (biases and weight-scale gains trained against the fp32
     logits, `quant/fitting/tune.py`).
 10: RecipeInfo.per_row_max_channels (per-row activation scales only on inputs of at most
     that many channels).
 11: RecipeInfo.scale_candidates and .refine_sweeps (compensating rounding's search over
     weight scales and its coordinate-descent sweeps, `quant/fitting/rounding.py`);
     RecipeInfo.headroom (static activation scales above the calibrator's amax).
 12: EngineInfo.fp8_padded_output (fused 1x1 convs writing the next conv's zero padding
     around their output, `quant/rewrites/pad_handoff.py`); EmulationGap.engine_only_differ,
     .emulation_only_differ and .split_mcnemar_p (which of the two differs from fp32 where
     only one does); EmulationGap.float32_* and StudyConfig.float32_engine (the FP8 engine
     built in float32 against its emulation); OptionStep.kl_change/_low/_high (the search keeps
     an option on a paired decrease beyond its interval).
 13: EmulationGap.half_floor_* (the emulation with its stored values rounded to the FP8
     engine's half dtype: the floor for an engine that stores in it between layers) and
     EmulationGap.floor_only_differ, .floor_emulation_only_differ, .floor_split_mcnemar_p (the
     reordered run's split against the emulation, the scale for the engine's).
 14: StudyRecord.sequential (the looks of a `--heldout auto` study at the quality gates, each
     an anytime-valid interval; `record/sequential.py`); StudyConfig.heldout also takes
     "auto" or "auto:MAX" (a count before); StudyRecord.per_image (the sealed side file of
     per-image rows, `record/side.py`); DataInfo.extended (held-out images added by
     `quantstudy extend`).
 15: ImageSet.ids may be None: a held-out set's ids are kept in the per-image side file
     only (its rows name them), so the record does not grow with the held-out images.
 16: StudyConfig.quality (False: a speed-only study that runs no quality pass, so its
     record has no quality section and its decision is inconclusive); ModelInfo.macs (the
     multiply-accumulates of the model's conv and linear layers on one image at its input size,
     counted by forward hooks, `model/macs.py`).; EngineInfo.fp8_rewrites_skipped (an engine rewrite
     that could not handle the model, and why: the engine was built without it).
 17: LayerKernel.kernel "fp16" and LayerKernel.fp16_us, EngineInfo.fp8_stepped_aside (a
     "fastest" engine keeps a selected layer in its compute dtype where FP8 was slower at every
     timed batch, `engines/step_aside.py`).
 18: EngineInfo.fp8_kernel is "fused" or "scaled_mm" only: an engine whose kernels were chosen
     per layer is "fused" with its fp8_kernel_choice (older records' "fastest" converts on
     load, `EngineInfo._nested`); StudyConfig.fp8_kernel keeps "fastest", the option
     (`KernelOption`). The engine's fp8_* fields are one section in code (`FP8Layout`), written
     flat as before.
 19: StageTime.tuning (the Triton tile tuning inside a stage: launches, configs, compile and
     timing seconds) and StageTime.lock_wait_s (seconds waiting for the GPU lock, zoo --jobs).
 20: Environment.lab_switches (the lab switches the study ran under, `env/switches.py`:
     engines computed or tuned otherwise than the commit alone says); StudyConfig.fp8_accumulate
     (how the FP8 products sum: "promote128", what older records ran, or "fast").
 21: StudyConfig.fp8_accumulate defaults to "fast" and a study records the accumulation its
     engines ran, so null means what it meant before: promote128, or a lab interval its
     lab_switches name (`record/build_spec.py: promote_of`).
 22: StageTime.lock_held_s (seconds the stage held the GPU lock, zoo --jobs).
 23: StageTime.choices (where the stage's autotuned launches took their configs: the shipped
     tuning table, the machine's store, or tuned; `quant/kernels/table.py`).
 24: LayerKernel.us (each timing of a per-layer kernel choice by backend name, "fp16" for the
     float layer; `quant/backends/`) replaces fused_us, scaled_mm_us and fp16_us, which older
     records' rows read into it; EngineInfo.fp8_kernel and LayerKernel.kernel name a backend
     of the registry.
 25: Environment.triton (the Triton version the study imported, `env/machine.py`; None: none
     installed, or recorded before).
 26: RecipeInfo.sequential renamed RecipeInfo.propagated, the recipe's name for the fit;
     older records' `sequential` reads into it.
 27: EngineInfo.fp8_gelu (layer -> the GELU it computes, erf or tanh: cuBLASLt's GELU
     epilogue is the tanh form; the emulation computes the same, `quant/layers/gelu.py`) and
     RecipeInfo.gelu (the recipe's `gelu:`, "any" or "erf").

Every field added since version 1 is optional, so version-1 files still load (`report/render.py`
reads every version up to `SCHEMA_VERSION`); a record keeps the version it was written with.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 27
OLDEST_SCHEMA_VERSION = 1  # the oldest version this code still reads


class Section(BaseModel):
    """Base of every record section, and of every other strict model the package reads or writes
    (recipes, policies, model lists, sweep and zoo rows): immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")
