"""The recipe file format: typed models, and YAML parsing with errors that name the file line.

A recipe (YAML) says which layers to quantize and how::

    name: res2net_all_after_stem          # letters, digits, _ . -
    description: every convolution after the stem
    variant_of: null                      # optional: the recipe this one is a variant of
    format: fp8_e4m3                      # int8 and nvfp4 are reserved, not implemented yet
    gelu: any                             # or erf: no backend's tanh GELU (cuBLASLt's epilogue)
    weights:
      granularity: per_channel            # or per_tensor; scale = amax / 448 (FP8 E4M3 max)
      fold_bn: true                       # fold BatchNorm into the conv before taking amax
      bias_correction: false              # subtract the mean output shift of FP8 weight rounding
      rounding: nearest                   # or compensating (quant/fitting/rounding.py)
      scale_candidates: 1                 # compensating: scales tried per channel (one octave)
      refine_sweeps: 0                    # compensating: coordinate-descent sweeps after it
      propagated: false                   # fit rounding and bias to the partly quantized net
      tune: none                          # or bias / scale_bias: trained against fp32 logits
      tune_epochs: 10                     # passes over the calibration images when tuning
    activations:
      granularity: per_tensor             # static per-tensor scales, or per_row (dynamic)
      per_row_max_channels: null          # per_row: only inputs of at most this many channels
      calibrator: max                     # max | percentile | mse | entropy
      headroom: 1.0                       # static scales: the calibrator's amax x this / 448
      params: {}                          # e.g. {percentile: 99.99}; defaults are filled in
      layer_calibrators: {}               # layer name -> calibrator, overriding `calibrator`
      migration: none                     # or smooth (quant/fitting/migrate.py)
      migration_alpha: 0.5                # smooth: how much of the range moves to the weights
    rules:                                # ordered; everything starts excluded; last match wins
      - include: {op: conv2d}
        why: every convolution is a candidate   # becomes the reason in the layer table
      - exclude: {position: first_conv}
        why: the stem sees the raw image and has 3 input channels
        optional: false                   # true: matching no layer of a model is not noted

Activation quantization uses ONE shared quantizer per tensor: when several FP8 layers read the
same tensor (e.g. a block input feeding a 1x1 conv and a 1x1 shortcut), they share one
quantize step and one scale, calibrated once for that tensor. The calibration code implements it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Literal

import yaml
from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantstudy.recipe.selectors import Selector
from quantstudy.recipe.yaml_lines import (
    Loc,
    compose_yaml,
    explain,
    key_lines,
    line_for,
    loc_path,
)
from quantstudy.record.base import Section
from quantstudy.record.errors import UserError
from quantstudy.record.readers import decode_utf8
from quantstudy.record.vocab import (
    ActivationGranularity,
    Calibrator,
    GeluPolicy,
    Migration,
    Rounding,
    Tuning,
    WeightGranularity,
)

# Formats the schema knows; a message means "reserved, not implemented yet".
FORMATS: dict[str, str | None] = {
    "fp8_e4m3": None,
    "int8": "int8 is reserved for a later version and not implemented yet",
    "nvfp4": "nvfp4 is reserved for a later version and not implemented yet",
}


@dataclass(frozen=True)
class CalibParam:
    """One float parameter of a calibrator: default and allowed closed range."""

    default: float
    low: float
    high: float
    integer: bool = False
    doc: str = ""


# Calibrator name -> its parameters, as the calibrators in quant/calibration/calibrators.py take
# them (a unit test checks names and defaults against their constructors). The study passes the
# filled-in params to the calibrator, so the record states every value that was used.
_SEARCH = {
    "num_candidates": CalibParam(128, 2, 4096, integer=True, doc="clip values tried"),
    "min_ratio": CalibParam(2.0**-8, 1e-6, 1.0, doc="smallest clip tried, x max |x|"),
}
CALIBRATORS: dict[str, dict[str, CalibParam]] = {
    Calibrator.MAX: {},
    # below 50 a percentile clips most values: surely a typo for 99.x
    Calibrator.PERCENTILE: {"percentile": CalibParam(99.99, 50.0, 100.0, doc="percentile of |x|")},
    Calibrator.MSE: _SEARCH,
    Calibrator.ENTROPY: {
        **_SEARCH,
        # TensorRT's INT8 range; below it the objective degenerates
        # (quant/calibration/calibrators.py)
        "min_ratio": CalibParam(1 / 16, 1e-6, 1.0, doc="smallest clip tried, x max |x|"),
    },
}


class WeightSpec(Section):
    """Weight scales: per output channel or per tensor, amax / 448 of the (BN-folded) kernel.

    `bias_correction`: fold the expected output shift of FP8 weight rounding, (Wq - W) . E[x]
    with E[x] the per-channel mean of the layer's input over the calibration images, into the
    bias (`quant/fitting/bias_correction.py`).

    `rounding`: `nearest` rounds each weight to its nearest FP8 value; `compensating` rounds one
    input channel at a time and pushes each rounding error onto the channels not yet rounded
    through the second moment of the layer's input over the calibration images
    (`quant/fitting/rounding.py`: procedure, damping, order, cost). Order with bias correction: the
    weights are rounded first, then the bias is corrected for the shift of those stored weights.

    `scale_candidates` and `refine_sweeps` (compensating rounding only; they need its second
    moment): each channel is rounded on that many scales spread over one octave above amax/448
    and keeps the one with the smallest output error, then that many coordinate-descent sweeps
    lower the error further (`quant/fitting/rounding.py`). The stored weights and scales change; the
    engines and their speed do not.

    `propagated` (`sequential` in older recipes, read with a warning): fit both, layer by
    layer in execution order, to the fp32 network's output of that layer from the input the
    partly quantized network gives it (earlier FP8 layers and this layer's own activation
    quantization included), instead of from the fp32 network's input alone
    (`quant/fitting/propagated.py`: the fit, its cost). Changes what `rounding` and
    `bias_correction` are fitted to, not whether they apply.

    `tune`: after all of the above, train every selected layer's bias (`bias`), and each output
    channel's gain folded into its weight scale (`scale_bias`, per-channel weights only),
    jointly against the fp32 network's logits on the calibration images, the FP8 weights fixed
    (`quant/fitting/tune.py`: objective, hold-out, cost); `tune_epochs` passes over them.
    """

    granularity: WeightGranularity = WeightGranularity.PER_CHANNEL
    fold_bn: bool = True
    bias_correction: bool = False
    rounding: Rounding = Rounding.NEAREST
    scale_candidates: int = Field(default=1, ge=1, le=64)
    refine_sweeps: int = Field(default=0, ge=0, le=100)
    propagated: bool = Field(
        default=False, validation_alias=AliasChoices("propagated", "sequential")
    )
    tune: Tuning = Tuning.NONE
    tune_epochs: int = Field(default=10, ge=1, le=1000)

    @model_validator(mode="after")
    def _tune_needs_channels(self) -> WeightSpec:
        if self.tune is Tuning.SCALE_BIAS and self.granularity is not WeightGranularity.PER_CHANNEL:
            raise ValueError(
                "tune: scale_bias folds a gain per output channel into the weight scales, which "
                "needs granularity: per_channel (use tune: bias with per_tensor)"
            )
        return self

    @model_validator(mode="after")
    def _searches_need_compensating(self) -> WeightSpec:
        searched = self.scale_candidates > 1 or self.refine_sweeps > 0
        if searched and self.rounding is not Rounding.COMPENSATING:
            raise ValueError(
                "scale_candidates and refine_sweeps search under the layer's input second "
                "moment, which only compensating rounding collects: set rounding: compensating, "
                "or leave them at 1 and 0"
            )
        return self


CalibratorName = Calibrator


class ActivationSpec(Section):
    """Activation scales; one shared quantizer per tensor.

    `granularity`: `per_tensor`, one static scale per tensor from a calibrator; `per_row`, one
    scale per row (a pixel of a conv's input map, a token of a linear's input) computed at run
    time, max |row| x float32(1/448) (`quant.formats.fp8.row_scale`; no calibration; each row costs
    a max before its quantize).
    `per_row_max_channels`: with `per_row`, only layers whose input has at most this many
    channels take per-row scales; the others keep static per-tensor ones. A row's largest value
    is exact under its own scale, so short rows gain most (the expand convs of inverted
    residual blocks, docs/fp8-options.md), and the fused kernel quantizes such rows in
    its prologue without a pass of its own (`quant/kernels/gemm.py`).
    `layer_calibrators`: layer name -> calibrator (with its default parameters) for the tensor
    that layer reads, overriding `calibrator`; `quantstudy search` chooses them.
    `migration`: `smooth` moves range between each input channel of an FP8 layer and the weights
    that read it (SmoothQuant's factor max|x_c|^alpha / max|W_c|^(1 - alpha)), only where the
    float network stays equal (`quant/fitting/migrate.py`); `migration_alpha` is that alpha.
    `headroom`: every static scale is the calibrator's amax x headroom / 448. FP8's rounding
    error is relative, so a larger scale costs the values almost nothing until they fall into
    E4M3's subnormals (2^-6 below the largest binade's start x 448, about 1/28,000 of the clip
    value), while a held-out value above the calibration images' amax saturates and loses its
    whole excess (Transformer Engine's FP8 recipes keep a `margin` for that reason). The
    recorded amax is the clip value, headroom included.
    """

    granularity: ActivationGranularity = ActivationGranularity.PER_TENSOR
    calibrator: CalibratorName = Calibrator.MAX
    params: dict[str, float] = Field(default_factory=dict, validate_default=True)
    per_row_max_channels: int | None = Field(default=None, ge=1)
    layer_calibrators: dict[str, CalibratorName] = Field(default_factory=dict)
    migration: Migration = Migration.NONE
    migration_alpha: float = Field(default=0.5, ge=0.0, le=1.0)
    headroom: float = Field(default=1.0, ge=1.0, le=256.0)

    @model_validator(mode="after")
    def _rows_limit_needs_rows(self) -> ActivationSpec:
        if self.per_row_max_channels is not None and self.granularity != "per_row":
            raise ValueError(
                "per_row_max_channels limits per-row scales to narrow inputs; it needs "
                "granularity: per_row"
            )
        return self

    @field_validator("params")
    @classmethod
    def _fill_params(cls, params: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        """Check names and ranges against the calibrator, fill defaults: the record is explicit."""
        name = info.data.get("calibrator")
        if name is None:  # the calibrator itself failed validation; that error is reported
            return params
        spec = CALIBRATORS[name]
        unknown = sorted(set(params) - set(spec))
        if unknown:
            known = ", ".join(spec) or "none"
            raise ValueError(
                f"calibrator '{name}' has no parameter {unknown[0]!r} (known: {known})"
            )
        for key, p in spec.items():
            value = params.get(key, p.default)
            if not p.low <= value <= p.high or (p.integer and value != int(value)):
                kind = "an integer" if p.integer else "a number"
                raise ValueError(f"{key} must be {kind} in [{p.low:g}, {p.high:g}], got {value:g}")
        return {key: float(params.get(key, p.default)) for key, p in spec.items()}


class Rule(Section):
    """One ordered rule: `include` or `exclude` the layers its selector matches, and why."""

    include: Selector | None = None
    exclude: Selector | None = None
    why: str | None = Field(default=None, min_length=1)
    # A generic recipe's rule for another kind of model (a ViT has no 1x1 conv): matching no
    # layer, or only layers a later rule decides, is then expected and not noted.
    optional: bool = False

    @model_validator(mode="after")
    def _one_action(self) -> Rule:
        if (self.include is None) == (self.exclude is None):
            raise ValueError("a rule has exactly one of `include:` or `exclude:` (a selector)")
        return self

    @property
    def action(self) -> Literal["include", "exclude"]:
        return "include" if self.include is not None else "exclude"

    @property
    def selector(self) -> Selector:
        selector = self.include if self.include is not None else self.exclude
        assert selector is not None  # guaranteed by _one_action
        return selector


class Recipe(Section):
    """A validated recipe. Built from a file by `parse_recipe`, which also keeps its sha256 and
    the line of every key, so later errors (a pattern matching no layer) can name the line.

    `gelu`: which GELU an FP8 layer whose epilogue computes one may run. `any` (default): the
    backend's own form, which the record names per layer and the emulation computes (cuBLASLt's
    GELU epilogue is the tanh approximation, timm's `nn.GELU` erf; docs/cublaslt.md measures
    what the difference costs). `erf`: erf only, so a cuBLASLt layer leaves GELU to the fused
    kernel (`quant/cublaslt/problem.py: epilogue_for`)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    variant_of: str | None = None
    format: str = "fp8_e4m3"
    gelu: GeluPolicy = GeluPolicy.ANY
    weights: WeightSpec = WeightSpec()
    activations: ActivationSpec = ActivationSpec()
    rules: list[Rule] = Field(min_length=1)

    _sha256: str | None = PrivateAttr(default=None)
    _origin: str = PrivateAttr(default="<recipe>")
    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(f"unknown format {value!r} (known: {', '.join(FORMATS)})")
        if FORMATS[value] is not None:
            raise ValueError(f"{FORMATS[value]}; use fp8_e4m3")
        return value

    @property
    def sha256(self) -> str:
        """Hash of the recipe file's bytes; for a recipe built in code, of its canonical JSON."""
        if self._sha256 is not None:
            return self._sha256
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(canonical).hexdigest()

    def where(self, loc: tuple[str | int, ...]) -> str:
        """`<file> line N: rules[2].include.name_glob` for messages about part of this recipe."""
        line = line_for(loc, self._lines)
        at = f" line {line}" if line is not None else ""
        return f"{self._origin}{at}: {loc_path(loc)}"


# Recipe keys renamed, (section, old key) -> new key: the old key still reads (the field's
# `validation_alias`), with a FutureWarning naming the new one, as a renamed built-in does
# (`builtin.py: RENAMED`); FutureWarning, not DeprecationWarning, because a recipe's author
# runs the CLI, where Python hides a DeprecationWarning raised inside a library.
RENAMED_KEYS = {("weights", "sequential"): "propagated"}


def _warn_renamed_keys(data: dict[str, object], lines: dict[Loc, int], origin: str) -> None:
    for (section, old), new in RENAMED_KEYS.items():
        keys = data.get(section)
        if isinstance(keys, dict) and old in keys:
            warnings.warn(
                f"{origin} line {lines[(section, old)]}: {section}.{old} is now named "
                f"{section}.{new} (the same option); rename the key",
                FutureWarning,
                stacklevel=3,
            )


def parse_recipe(raw: bytes, origin: str) -> Recipe:
    """Parse and validate recipe YAML; every mistake is a `UserError` naming `origin` and a line;
    an old key (`RENAMED_KEYS`) reads with a warning."""
    root, data = compose_yaml(decode_utf8(raw, f"recipe {origin}"), origin)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise UserError(
            f"{origin} line 1: a recipe is a YAML mapping with keys "
            f"{', '.join(Recipe.model_fields)} (see `quantstudy recipes show`)"
        )
    lines = key_lines(root, ())
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise UserError(explain(err, lines, origin, Recipe, {Selector: "selector"})) from None
    _warn_renamed_keys(data, lines, origin)
    recipe._sha256 = hashlib.sha256(raw).hexdigest()
    recipe._origin = origin
    recipe._lines = lines
    return recipe
