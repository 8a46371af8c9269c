"""The kernel timer: every kernel-level time of the package is taken here, the same way (a
product bench's variants, the depthwise bench's, the autotuner's configs, cuBLASLt's algorithms,
the copy bandwidth of the rooflines). Whole engines are timed by the speed harness instead
(`speed/harness.py`: interleaved rounds of fp16 and FP8).

How (`triton.testing.do_bench_cudagraph`): `fn` is called once, then five times to estimate its
time t; a CUDA graph of n = max(1, rep / t) back-to-back calls is captured and replayed ten
times, and each replay's time over n is one sample. So `rep` is milliseconds of calls per
replay, not a count: a longer graph averages more calls into each sample and costs as much
longer to capture (Python launches each call once while capturing). The time returned is `stat`
of the ten samples: "median" (the autotuner, cuBLASLt's choice: robust to one slow replay) or
"mean" (the product and depthwise benches, the copy bandwidth, as their records say).

Replaying a graph leaves the host's launch cost out, as the engines do (they run as CUDA graphs):
timed from the host, a product of a few microseconds measures its launch, and descriptor
configs, whose launch encodes the tensor maps, would lose to slower pointer tiles.

`eager`: call `fn` once more before, on the current stream, and wait for it, so that compilation,
autotuning, cuBLAS/cuDNN heuristics and lazy loads happen outside the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Stat = Literal["mean", "median"]


def time_ms(fn: Callable[[], object], *, rep: float, stat: Stat, eager: bool = False) -> float:
    """Milliseconds per call of `fn`: `stat` of ten replays of a graph of about `rep` ms of
    calls (the module docstring)."""
    import torch
    from triton.testing import do_bench_cudagraph

    if eager:
        fn()
        torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=rep, return_mode=stat))


def time_us(fn: Callable[[], object], *, rep: float, stat: Stat, eager: bool = False) -> float:
    """`time_ms` in microseconds."""
    return time_ms(fn, rep=rep, stat=stat, eager=eager) * 1e3
