"""The time a sweep's grid will take, from the stage timings of studies already recorded.

Earlier studies are the complete study records under the sweep's --out (an earlier run of this
sweep, or of another sweep into the same folder). A point is estimated from the median total of
the earlier studies of the same model on the same device with the same image counts and speed
setting; a point with no such study has no estimate, and the total says how many are missing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from quantstudy.record.errors import UserError
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.sweep.grid import GridPoint

Signature = tuple[str, str, int, int | str, bool]


def _signature(model: str, device: str, calib: int, heldout: int | str, speed: bool) -> Signature:
    return (model, device, calib, heldout, speed)


def recorded_totals(out: Path) -> dict[Signature, list[float]]:
    """Study totals (seconds) under `out`, by (model, device, calib, heldout, speed)."""
    found: dict[Signature, list[float]] = {}
    for path in sorted(out.glob(f"*/{RECORD_FILE}")):
        try:
            record = load_record(path)
        except UserError:  # unreadable here (a newer schema, an edit): no estimate from it
            continue
        if record.status != "complete" or record.timings is None:
            continue
        config = record.config
        key = _signature(
            config.model, config.device, config.calib, config.heldout, record.speed is not None
        )
        found.setdefault(key, []).append(float(record.timings.total_s))
    return found


@dataclass(frozen=True)
class Estimate:
    seconds: float  # summed study time of the estimated points
    estimated: int
    missing: int  # points with no earlier study to go by
    workers: int

    def line(self) -> str:
        if self.estimated == 0 and self.missing == 0:
            return "estimated time: nothing to run"
        if self.estimated == 0:
            return "estimated time: no estimate (no earlier study of these settings has timings)"
        wall = self.seconds / self.workers
        text = (
            f"estimated time: {_minutes(self.seconds)} of study time for {self.estimated} "
            f"point(s), about {_minutes(wall)} on {self.workers} worker(s)"
        )
        if self.missing:
            text += f"; {self.missing} point(s) have no estimate (no earlier study to go by)"
        return text


def estimate(points: list[GridPoint], out: Path, workers: int) -> Estimate:
    totals = recorded_totals(out) if out.is_dir() else {}
    seconds, estimated = 0.0, 0
    for p in points:
        c = p.config
        known = totals.get(_signature(c.model, c.device, c.calib, c.heldout, c.speed))
        if known:
            seconds += statistics.median(known)
            estimated += 1
    return Estimate(seconds, estimated, len(points) - estimated, max(1, workers))


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
