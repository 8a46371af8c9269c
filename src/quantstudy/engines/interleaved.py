"""Callables timed in interleaved rounds, and the statistics of the rounds: the one timing
loop of the engine harness (`speed/harness.py`) and of per-layer timing
(`engines/layer_timing.py`: the search's table and the kernel choice).

On CUDA each callable is captured in a CUDA graph and replayed `iters` times per round between
two CUDA events; the rounds of the callables alternate ABBA so a linear drift (clocks,
temperature) cancels in the pairs (module docstring of `speed/harness.py`). On CPU the calls run
eagerly under the host clock. Here, below `speed/`, so that the kernel choice, which runs while
an engine is built, times with the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from quantstudy.gpu.timing_lock import timing
from quantstudy.record import TimingStats
from quantstudy.record.errors import UserError

CAPTURE_WARMUP_MIN = 3
"""Eager calls of each callable before its CUDA graph capture, at least (PyTorch docs: a few)."""

Variants = Callable[[], object] | Sequence[Callable[[], object]]


class _Runner(Protocol):
    def timed_round(self, iters: int) -> float:
        """Run `iters` calls, rotating over the variants; return ms per call."""
        ...


class _GraphRunner:
    """The variants of one engine captured as CUDA graphs in one pool, warmed up, replayable."""

    def __init__(self, variants: Sequence[Callable[[], object]], warmup: int, device: torch.device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(warmup, CAPTURE_WARMUP_MIN)):
                for fn in variants:
                    fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.outputs: list[object] = []  # kept alive: graph outputs live in the graph's pool
        pool = None
        for fn in variants:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs.append(fn())
            if pool is None:
                pool = graph.pool()
            self.graphs.append(graph)

        for _ in range(warmup):
            for graph in self.graphs:
                graph.replay()
        torch.cuda.synchronize(device)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def timed_round(self, iters: int) -> float:
        n = len(self.graphs)
        self.start.record()
        for i in range(iters):
            self.graphs[i % n].replay()
        self.end.record()
        self.end.synchronize()  # the one synchronisation of the round, after the end event
        elapsed_ms: float = self.start.elapsed_time(self.end)
        return elapsed_ms / iters


class _EagerRunner:
    """The variants of one engine called eagerly, timed with the host clock (CPU runs)."""

    def __init__(self, variants: Sequence[Callable[[], object]], warmup: int):
        self.variants = list(variants)
        for _ in range(warmup):
            for fn in self.variants:
                fn()

    def timed_round(self, iters: int) -> float:
        n = len(self.variants)
        start = time.perf_counter()
        for i in range(iters):
            self.variants[i % n]()
        return (time.perf_counter() - start) * 1e3 / iters


def check_counts(rounds: int, iters: int, warmup: int) -> None:
    if rounds < 1 or iters < 1 or warmup < 0:
        raise UserError(
            f"timing needs rounds >= 1, iters >= 1 and warmup >= 0; got rounds={rounds}, "
            f"iters={iters}, warmup={warmup}"
        )


def time_interleaved(
    callables: Mapping[str, Variants],
    rounds: int,
    iters: int,
    warmup: int,
    *,
    device: torch.device | str = "cuda",
) -> dict[str, list[float]]:
    """Time each named callable in alternating rounds; return ms per call, one value per round.

    A value of `callables` is one zero-argument callable, or a sequence of them (variants of the
    same call on different input buffers: one CUDA graph each, replayed in rotation within a
    round). On a CUDA `device`, each variant is warmed up eagerly on a side stream
    (max(warmup, CAPTURE_WARMUP_MIN) calls), captured in a CUDA graph (the variants of one name
    share a memory pool), replayed `warmup` more times untimed, and then each round replays
    `iters` times between two CUDA events, with one synchronisation after the round. On a CPU
    `device` the calls run eagerly (`time.perf_counter`). Rounds alternate ABBA (given, reversed).
    """
    check_counts(rounds, iters, warmup)
    if not callables:
        raise ValueError("time_interleaved needs at least one callable")
    device = torch.device(device)
    variants = {
        name: [value] if callable(value) else list(value) for name, value in callables.items()
    }
    if any(not fns for fns in variants.values()):
        raise ValueError("each name needs at least one callable")

    runners: dict[str, _Runner]
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError("CUDA timing was asked for but no CUDA GPU is available")
        # warm-up, capture and rounds with the GPU held alone where studies share it
        with torch.cuda.device(device), timing():
            runners = {name: _GraphRunner(fns, warmup, device) for name, fns in variants.items()}
            return _run_rounds(runners, rounds, iters)
    runners = {name: _EagerRunner(fns, warmup) for name, fns in variants.items()}
    return _run_rounds(runners, rounds, iters)


def _run_rounds(runners: Mapping[str, _Runner], rounds: int, iters: int) -> dict[str, list[float]]:
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(runners[name].timed_round(iters))
    return times


def timing_stats(values: Sequence[float]) -> TimingStats:
    """Median, quartiles (numpy's default linear percentiles), min, max and count of `values`."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"timing_stats needs a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"timing_stats got a non-finite value: {arr.tolist()}")
    q1, median, q3 = np.percentile(arr, [25.0, 50.0, 75.0])
    return TimingStats(
        median=float(median),
        q1=float(q1),
        q3=float(q3),
        min=float(arr.min()),
        max=float(arr.max()),
        n=int(arr.size),
    )
