"""`bench/study_time.py`: the stage table of a cold and a warm study; `sweep/caches.py`: the host
caches of a sweep, all under one folder (what `tools/lab/bench/study_time.py` gives each phase)."""

from pathlib import Path

from quantstudy.bench.study_time import stage_table
from quantstudy.study.calib_stats import STATS_ENV
from quantstudy.sweep.caches import CACHE_ENV, CACHE_FOLDERS, caches_under


def _phase(stages: dict[str, float], wall: float, tuned: int) -> dict:
    record = {
        "timings": {
            "stages": [{"stage": s, "seconds": v} for s, v in stages.items()],
            "total_s": sum(stages.values()),
        }
    }
    tuning = {"compile_s": 2.0 * tuned, "tune_s": 1.0 * tuned, "tuned_launches": tuned}
    return {"record": record, "wall_s": wall, "tuning": tuning}


def test_the_table_lists_every_stage_of_both_phases_in_run_order():
    table = stage_table(
        {
            "cold": _phase({"load": 1.0, "engine fp8: run": 18.0, "timing": 95.8}, 120.0, 57),
            "warm": _phase({"load": 1.2, "timing": 22.3}, 30.0, 0),
        }
    )
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "cold", "warm"]
    assert [line.split("  ")[0].strip() for line in lines[1:4]] == [
        "load",
        "engine fp8: run",
        "timing",
    ]
    assert "engine fp8: run" in lines[2] and lines[2].split()[-1] == "-"  # not in the warm run
    assert lines[4].split()[-2:] == ["114.8", "23.5"]  # study total (record)
    assert "57.0" in next(line for line in lines if "launches tuned" in line)


def test_each_phase_gets_the_host_caches_of_a_sweep_under_one_folder(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # the user's own is not kept here
    env = caches_under(tmp_path)
    assert env[CACHE_ENV] == str(tmp_path)
    assert {env[v] for v in CACHE_FOLDERS} == {
        str(tmp_path / s) for s in ("inductor", "triton", "calibration")
    }
    assert STATS_ENV in CACHE_FOLDERS
