"""The study's config model lives in the record (`record/inputs.py`), which holds it; this is
the name the orchestrator and the package root export it under."""

from __future__ import annotations

from quantstudy.record.inputs import StudyConfig

__all__ = ["StudyConfig"]
