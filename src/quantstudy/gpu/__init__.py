"""The one GPU shared between processes: the lock every timing holds, so that studies run side
by side (`quantstudy zoo --jobs N`) never time on the GPU at once (`timing_lock.py`), and the
kernel timer every kernel-level time is taken with (`timer.py`).

Below the kernels (`quant/`, whose autotuner times) and the speed harness (`speed/`), which both
take it; it imports nothing of quantstudy.
"""
