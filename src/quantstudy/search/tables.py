"""Record sections of the search: the sensitivity table, the per-layer speed table, the outcome.

The models live in the study schema (`quantstudy.record`, version 2: `StudyRecord.
sensitivity`, `StudyRecord.layer_speed`, `StudyRecord.search`, `Variant.predicted` and
`Variant.measured`); this module re-exports them for the search code.
"""

from __future__ import annotations

from quantstudy.record import (
    LayerChoice,
    LayerSensitivity,
    LayerSpeed,
    LayerSpeedSection,
    Measured,
    Mode,
    SearchBudget,
    SearchPrediction,
    SearchSection,
    SensitivitySection,
)

__all__ = [
    "LayerChoice",
    "LayerSensitivity",
    "LayerSpeed",
    "LayerSpeedSection",
    "Measured",
    "Mode",
    "SearchBudget",
    "SearchPrediction",
    "SearchSection",
    "SensitivitySection",
]
