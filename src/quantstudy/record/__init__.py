"""The study record: the schema every stage writes into, its atomic IO and its error type.

The ground every stage writes into: it imports nothing else of quantstudy but the lab switches
it names (`env/switches.py`). The record's sections and values (`__all__`, `StudyConfig` among
them) are imported from this package, and only from here outside it (`from quantstudy.record
import StudyRecord`); everything else of record/ from the module that defines it (`UserError`
from `errors.py`, `Section` from `base.py`, the vocabularies from `vocab.py`).
"""

from quantstudy.record.base import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION
from quantstudy.record.decision import Decision, Gate, Redecision
from quantstudy.record.engines import EngineInfo, FP8Layout, KernelChoice, LayerKernel
from quantstudy.record.inputs import (
    DataInfo,
    Environment,
    ImageSet,
    ModelInfo,
    Preprocessing,
    SkippedImage,
    StudyConfig,
)
from quantstudy.record.quality import (
    EmulationGap,
    EngineQuality,
    MeanInterval,
    NonFiniteScan,
    QualitySection,
)
from quantstudy.record.recipe import CalibrationInfo, LayerDecision, RecipeInfo, TensorScale
from quantstudy.record.search import (
    LayerChoice,
    LayerSensitivity,
    LayerSpeed,
    LayerSpeedSection,
    Measured,
    Mode,
    OptionStep,
    SearchBudget,
    SearchPrediction,
    SearchSection,
    SensitivitySection,
)
from quantstudy.record.sequential import GateLook, Look, SequentialSection
from quantstudy.record.speed import (
    BatchSpeed,
    IdealSpeed,
    KernelBreakdown,
    KernelGroupTime,
    SpeedSection,
    TimingStats,
)
from quantstudy.record.study import StudyRecord, Variant
from quantstudy.record.timings import StageTime, TimingsSection

__all__ = [
    "OLDEST_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "BatchSpeed",
    "CalibrationInfo",
    "DataInfo",
    "Decision",
    "EmulationGap",
    "EngineInfo",
    "EngineQuality",
    "Environment",
    "FP8Layout",
    "Gate",
    "GateLook",
    "IdealSpeed",
    "ImageSet",
    "KernelBreakdown",
    "KernelChoice",
    "KernelGroupTime",
    "LayerChoice",
    "LayerDecision",
    "LayerKernel",
    "LayerSensitivity",
    "LayerSpeed",
    "LayerSpeedSection",
    "Look",
    "MeanInterval",
    "Measured",
    "Mode",
    "ModelInfo",
    "NonFiniteScan",
    "OptionStep",
    "Preprocessing",
    "QualitySection",
    "RecipeInfo",
    "Redecision",
    "SearchBudget",
    "SearchPrediction",
    "SearchSection",
    "SensitivitySection",
    "SequentialSection",
    "SkippedImage",
    "SpeedSection",
    "StageTime",
    "StudyConfig",
    "StudyRecord",
    "TensorScale",
    "TimingStats",
    "TimingsSection",
    "Variant",
]
