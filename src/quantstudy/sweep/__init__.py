"""Sweeps: many studies (models x recipes x calibrators x seeds x FP8 kernels), one
`quantstudy run --config` subprocess per grid point (its `StudyConfig` written as JSON by the
record's own model), on local workers or a Ray cluster, resumable.

Entry point: `run_sweep(SweepOptions)` (`quantstudy sweep SWEEP.yaml`).

Reuse across the grid (`caches.py`, one folder per host):
- Shared: Inductor's and Triton's on-disk caches (the FP8 kernels' tuned tiles among them), so a
  later study with the same shapes compiles and tunes warm; and the calibration statistics
  (`study/calib_stats.py`), so a model's calibration images pass through it once per sweep.
- Not shared: compiled engines. A compiled module lives in its study's process; what crosses
  processes is the caches above, which skip the compilation and tuning themselves.
"""
