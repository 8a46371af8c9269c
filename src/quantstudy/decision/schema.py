"""The decision policy as a validated model (format version 2; version-1 files convert).

Each quality gate names its baseline: `fp32` (the reference) or `fp16` (the engine FP8 would
replace). The top-1 gate is a non-inferiority test: FP8's top-1 may be at most `margin_points`
below the baseline's. Agreement and KL are absolute limits on how far FP8's outputs may move.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from quantstudy.record.base import Section
from quantstudy.record.vocab import Baseline, CompileMode, Engine


class SpeedPolicy(Section):
    min_speedup: float = Field(1.05, ge=1.0, le=100.0)
    batches: list[int] | None = None
    compile_mode: CompileMode | None = None

    @field_validator("batches")
    @classmethod
    def _batches(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty list; use null for every batch in the study")
        if any(b < 1 for b in v):
            raise ValueError("batches must be positive integers")
        if len(set(v)) != len(v):
            raise ValueError("batches must not repeat")
        return v


class Top1Policy(Section):
    baseline: Baseline = Baseline.FP16
    margin_points: float = Field(0.5, le=100.0)
    require_labels: bool = False

    @field_validator("margin_points")
    @classmethod
    def _margin(cls, v: float) -> float:
        if v < 0:
            raise ValueError(
                "the top-1 loss FP8 may have, in points, as a number >= 0 (0.5 allows a "
                "0.5-point loss); a negative margin would demand a gain"
            )
        return v

    @property
    def threshold(self) -> float:
        """The lowest acceptable top-1 change, as a fraction."""
        return -self.margin_points / 100.0


class AgreementPolicy(Section):
    baseline: Baseline = Baseline.FP32
    min: float = Field(0.97, gt=0.0, le=1.0)


class KlPolicy(Section):
    baseline: Baseline = Baseline.FP32
    max: float = Field(0.02, ge=0.0)


class QualityPolicy(Section):
    top1: Top1Policy = Top1Policy()
    agreement: AgreementPolicy = AgreementPolicy()
    kl_mean: KlPolicy = KlPolicy()

    @property
    def min_agreement(self) -> float:
        return self.agreement.min

    @property
    def max_kl_mean(self) -> float:
        return self.kl_mean.max


class Policy(Section):
    """A decision policy; the defaults are the built-in `default` preset's."""

    version: Literal[2] = 2
    engine: Literal[Engine.FP8] = Engine.FP8  # the engine under decision
    confidence: float = 0.95
    speed: SpeedPolicy = SpeedPolicy()
    quality: QualityPolicy = QualityPolicy()

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError("must lie strictly between 0 and 1 (0.95 for 95% intervals)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _from_version_1(cls, data: Any) -> Any:
        """Version-1 files (CI-low and point thresholds, all against fp32) keep their meaning
        as far as intervals allow: the same limits, fp32 baselines, 95% intervals."""
        if not isinstance(data, dict) or data.get("version") != 1:
            return data
        out = {k: v for k, v in data.items() if k not in ("speed", "quality")}
        out["version"] = 2
        speed = dict(data.get("speed") or {})
        speed.pop("q1_speedup_above", None)
        out["speed"] = speed
        q = dict(data.get("quality") or {})
        top1: dict[str, Any] = {"baseline": Baseline.FP32}
        if "top1_change_ci_low_above" in q:
            top1["margin_points"] = -100.0 * q.pop("top1_change_ci_low_above")
        if "require_labels" in q:
            top1["require_labels"] = q.pop("require_labels")
        agreement: dict[str, Any] = {"baseline": Baseline.FP32}
        if "min_agreement" in q:
            agreement["min"] = q.pop("min_agreement")
        kl: dict[str, Any] = {"baseline": Baseline.FP32}
        if "max_kl_mean" in q:
            kl["max"] = q.pop("max_kl_mean")
        out["quality"] = {**q, "top1": top1, "agreement": agreement, "kl_mean": kl}
        return out
