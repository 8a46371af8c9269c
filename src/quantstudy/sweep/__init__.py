"""Sweeps: many studies (models x recipes x calibrators x seeds x FP8 kernels), one
`quantstudy run` subprocess per grid point, on local workers or a Ray cluster, resumable.

Entry point: `run_sweep(SweepOptions)` (`quantstudy sweep SWEEP.yaml`).
"""
