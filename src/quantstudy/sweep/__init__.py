"""Sweeps: many studies (models x recipes x calibrators x seeds x FP8 kernels), one
`quantstudy run` subprocess per grid point, on local workers or a Ray cluster, resumable.

Entry point: `run_sweep(SweepOptions)` (`quantstudy sweep SWEEP.yaml`).

Reuse across the grid:
- Shared: Inductor's and Triton's on-disk caches, one per host (`caches.py`), so the second
  study of a model compiles warm.
- Not shared: calibration statistics. Each study collects them again for its own recipe and
  calibrator; sharing them needs the calibration stage (`quant/calibration/calibrate.py`, `study/`)
  to save per-tensor histograms keyed by (weights, calibration image ids, preprocessing, layer) and
  to load them, which is not built.
- Not shared: compiled fp16 engines. A compiled module lives in its study's process; what crosses
  processes is Inductor's cache above, which already skips the compilation itself.
"""
