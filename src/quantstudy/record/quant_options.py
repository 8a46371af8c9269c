"""The quantization options a plan is built from, typed with the vocabulary's enums.

One frozen type carries them from the recipe (`recipe/options.py` fills it) through the plan
(`quant/plan/build.py`) to the layers, so no stage translates strings: it lives on the ground
floor because the recipe and quant stages sit side by side and may not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantstudy.record.vocab import Calibrator, GeluPolicy, Migration, Rounding, Tuning


@dataclass(frozen=True)
class QuantOptions:
    """A recipe's quantization options (`recipe.schema.WeightSpec` and `ActivationSpec` say
    what each one does); the defaults are the recipe's."""

    per_channel: bool = True
    fold_bn: bool = True
    bias_correction: bool = False
    rounding: Rounding = Rounding.NEAREST
    scale_candidates: int = 1  # compensating rounding: scales tried per channel
    refine_sweeps: int = 0  # compensating rounding: coordinate-descent sweeps
    calibrator: Calibrator = Calibrator.MAX
    params: dict[str, float] = field(default_factory=dict)
    row_scales: bool = False
    row_max_channels: int | None = None  # per-row scales only on inputs this narrow
    layer_calibrators: dict[str, Calibrator] = field(default_factory=dict)
    migration: Migration = Migration.NONE
    migration_alpha: float = 0.5
    headroom: float = 1.0  # static scales: the calibrator's amax x this / 448
    propagated: bool = False  # the propagated fit (`quant/fitting/propagated.py`)
    tune: Tuning = Tuning.NONE
    tune_epochs: int = 10
    gelu: GeluPolicy = GeluPolicy.ANY  # the GELU forms an FP8 layer may compute (recipe `gelu:`)

    def __post_init__(self) -> None:
        # Enums from plain strings too (tests, JSON), so a misspelt option fails here.
        object.__setattr__(self, "rounding", Rounding(self.rounding))
        object.__setattr__(self, "calibrator", Calibrator(self.calibrator))
        object.__setattr__(self, "migration", Migration(self.migration))
        object.__setattr__(self, "tune", Tuning(self.tune))
        object.__setattr__(self, "gelu", GeluPolicy(self.gelu))
        calibrators = {k: Calibrator(v) for k, v in self.layer_calibrators.items()}
        object.__setattr__(self, "layer_calibrators", calibrators)
