"""The GPU held alone while something is timed, when several studies share one GPU.

The zoo's `--jobs N` runs N studies on one GPU so their compiles overlap; every code path that
times (the speed harness's rounds, the autotuner's config timing, the per-layer kernel choice)
runs inside `timing()`, which takes an exclusive `fcntl.flock` on the file `$QUANTSTUDY_TIMING_LOCK`
names, so no two timings share the GPU. Unset (one study, a plain `quantstudy run`): a no-op.
Re-entrant within a process (a harness round may launch a kernel that tunes), and only the
outermost block holds the file.

`waited_s()` is how long this process has waited to take the file so far, `held_s()` how long
it has held it: a study's stage timer reads both around each stage (`study/stage_timer.py`), so
the record says how much of a stage was spent behind another study's timing and how much the
stage kept the GPU from the others. Over a zoo run the held seconds of all its studies, against
its wall time, say how busy the one GPU lock was: near all of it, more studies at a time cannot
raise the rows a minute, only less timing per row can.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOCK_ENV = "QUANTSTUDY_TIMING_LOCK"
_held = threading.local()
_waited = [0.0]  # seconds this process has waited for the file, every thread
_holding = [0.0]  # seconds this process has held it
_adding = threading.Lock()


def waited_s() -> float:
    """Seconds this process has waited to take the lock so far (0.0 without `LOCK_ENV`)."""
    return _waited[0]


def held_s() -> float:
    """Seconds this process has held the lock so far (0.0 without `LOCK_ENV`)."""
    return _holding[0]


@contextmanager
def timing() -> Iterator[None]:
    """Hold the GPU alone for the block (module docstring); a no-op without `LOCK_ENV`."""
    path = os.environ.get(LOCK_ENV)
    depth = getattr(_held, "depth", 0)
    if not path or depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken = time.perf_counter()
        with _adding:
            _waited[0] += taken - start
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
            with _adding:
                _holding[0] += time.perf_counter() - taken
    finally:
        os.close(fd)
