"""Engine names and labels, and the lookups into a `StudyRecord` that several sections share."""

from __future__ import annotations

from quantstudy.record import EngineQuality, StudyRecord
from quantstudy.record.vocab import Engine

FP32, FP16, FP8 = Engine.FP32, Engine.FP16, Engine.FP8
FAKEQUANT, WEIGHT_ONLY = Engine.FAKEQUANT, Engine.FAKEQUANT_WEIGHTS
ACT_ONLY = Engine.FAKEQUANT_ACTIVATIONS
ENGINE_LABELS: dict[str, str] = {
    FP32: "fp32 (reference)",
    FP16: "fp16",
    FP8: "FP8",
    FAKEQUANT: "fake-quant (FP8 emulation)",
    WEIGHT_ONLY: "weight-only fake-quant",
    ACT_ONLY: "activation-only fake-quant",
}
RANDOM_WEIGHTS_BANNER = "quality numbers are meaningless: random weights"
CPU_BANNER = "timings on CPU are not meaningful"


def label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def shipped(r: StudyRecord) -> bool:
    return r.decision is not None and r.decision.ship


def engine_quality(r: StudyRecord, name: str) -> EngineQuality | None:
    if r.quality is None:
        return None
    return next((e for e in r.quality.engines if e.engine == name), None)


def weight_bytes(r: StudyRecord) -> dict[str, int]:
    if r.speed is not None and r.speed.weight_bytes:
        return dict(r.speed.weight_bytes)
    return {e.name: e.weight_bytes for e in r.engines}
