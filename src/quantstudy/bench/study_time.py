"""The stage table of a study timed cold and warm (`tools/lab/bench/study_time.py` runs the
studies on the GPU machine): each stage's seconds from the record's `timings`, in the order the
stages ran, then the study total, the process wall time and what the FP8 autotuners cost. Here,
not in the lab script, so its formatting is checked on the CPU."""

from __future__ import annotations

from typing import Any

# What follows the stages: (row, the phase result's key, the key under it or None)
_AFTER_STAGES = (
    ("process wall", "wall_s", None),
    ("fp8 autotune: compile", "tuning", "compile_s"),
    ("fp8 autotune: timing", "tuning", "tune_s"),
    ("fp8 autotune: launches tuned", "tuning", "tuned_launches"),
)
TOTAL = "study total (record)"


def stage_table(phases: dict[str, dict[str, Any]]) -> str:
    """Stage | seconds per phase (`-`: not in that phase's study). A phase's result holds its
    study record (`record`, None when the study wrote none), `wall_s` and its `tuning` summary."""
    names: list[str] = []
    seconds: dict[str, dict[str, float]] = {}
    for phase, result in phases.items():
        timings = (result.get("record") or {}).get("timings") or {"stages": [], "total_s": None}
        for s in timings["stages"]:
            if s["stage"] not in names:
                names.append(s["stage"])
            seconds.setdefault(s["stage"], {})[phase] = s["seconds"]
        seconds.setdefault(TOTAL, {})[phase] = timings["total_s"]
        for row, key, sub in _AFTER_STAGES:
            value = result[key] if sub is None else result[key][sub]
            seconds.setdefault(row, {})[phase] = value
    names += [TOTAL, *(row for row, _, _ in _AFTER_STAGES)]
    width = max(len(n) for n in names)
    lines = [f"{'stage':<{width}}  " + "  ".join(f"{p:>8}" for p in phases)]
    for name in names:
        cells = []
        for phase in phases:
            v = seconds.get(name, {}).get(phase)
            cells.append(f"{'-' if v is None else f'{v:.1f}':>8}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)
