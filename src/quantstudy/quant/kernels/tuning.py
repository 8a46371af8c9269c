"""One tuning path for every autotuned kernel (the fused FP8 product, the kxk conv, the depthwise
conv): how a study avoids paying the autotuner twice, and what a cold tune costs.

Kept apart from the launchers because it is process state (a log, a flag stack, a disk file),
not arithmetic: a launch with `tile=None` goes through `tuned_launch` with its kernel's `Tuned`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from quantstudy.gpu import timing_lock
from quantstudy.quant.kernels import choices, search, table
from quantstudy.quant.kernels.tiles import Config, config_words
from quantstudy.quant.private_api import async_compile_mode

Args = tuple[Any, ...]  # a kernel's positional arguments (tensors, descriptors, sizes)
Grid = Callable[[dict[str, Any]], tuple[Any, ...]]  # launch grid from a config's meta
Prune = Callable[..., list[Config]]  # Triton's early_config_prune: (configs, named args, **meta)

# --- What a tune costs, and how a study avoids paying it twice ------------------------------
#
# Each distinct launch (sizes, compile-time options, dtypes) is tuned once per process: every
# pruned config is compiled and timed from CUDA graphs (`search.py`). An engine sees one row
# count per layer shape and batch size, so a study's FP8 engine tunes each layer shape at each
# of its batches. Five things keep that to what the study needs:
#
# 1. The choice is stored per GPU, Triton version, kernel source and config list in a JSON file
#    beside the Inductor cache (`choices.py`): a later process launches the stored config
#    directly. (Triton's own disk cache of tuning results refuses configs with a pre-hook, and
#    the product's sets its descriptors' block shapes.) Before the store, the shipped table of
#    this GPU (`table.py`, package data built from a machine's store) gives the choices a zoo
#    run made, so a bare machine of a listed GPU tunes only what the table lacks.
# 2. On a miss the pruned configs are compiled in parallel threads first (Triton's
#    `AsyncCompileMode`, where the installed Triton has it), then timed.
# 3. The timing screens every config from a short graph and times only the fastest few at full
#    length (`search.fastest`).
# 4. Within `untimed_tiles()` a launch that was never tuned takes the first pruned config
#    without timing: for the quality passes, whose outputs do not depend on the tile (each
#    kernel's prune keeps only tiles that write the same bits: `mma_step` promotes the product's
#    sums at the same K, or, summing fast, every tile feeds the tensor cores the same K steps in
#    order (tests/gpu/test_gemm_tiles_gpu.py checks both); the kxk conv's kept tiles pad each
#    tap alike; the depthwise conv sums each output in one order), so only the timed batches
#    tune.
# 5. The convs' prunes keep at most `tiles.CONV_CONFIGS` configs per launch (`tiles.bounded`).
#
# `TUNE_LOG` lists each launch tuned in this process (its kernel, key, how many configs it
# compiled, screened and timed at full length, with how many threads, and the seconds of
# compiling and of timing), also appended as JSON lines to `$QUANTSTUDY_TUNE_LOG` where set
# (`tools/lab/bench/study_time.py`); `summary` adds them up per kernel.

TUNE_LOG: list[dict[str, Any]] = []
_UNTIMED: list[bool] = [False]

# Where each distinct launch of this process took its config, the first time it was launched
# timed: the shipped table (`table.py`), this machine's store (`choices.py`) or tuned here.
# A launch only ever untimed is in none (it took a config without a choice). The study record
# counts them per stage (`record/timings.py: TileChoices`), so a run says how much it tuned.
ORIGINS = ("table", "store", "tuned")
CHOICE_LOG: list[dict[str, str]] = []
_CHOSEN: set[str] = set()


@dataclass(frozen=True, eq=False)
class Tuned:
    """A tuned kernel as `tuned_launch` drives it: the Triton kernel, the configs it may launch
    with, the names its choice is keyed on (`keys`, as Triton's autotuner keys a launch), its
    arguments' names, and the prune that picks a launch's configs. `hooked` names the arguments
    a config's pre-hook changes (the product's descriptors take the tile's block shape): each
    config launches or compiles with its own copies."""

    name: str
    kernel: Any
    configs: list[Config]
    keys: list[str]
    prune: Prune
    hooked: tuple[str, ...] = ()

    @property
    def arg_names(self) -> list[str]:
        return list(self.kernel.arg_names)


def autotuned(
    name: str,
    kernel: Any,
    configs: list[Config],
    key: Sequence[str],
    prune: Prune,
    hooked: tuple[str, ...] = (),
) -> Tuned:
    """`kernel` tuned over `configs`, pruned per launch by `prune`. `key` must name every
    compile-time option the launcher passes (`tuned_launch` checks it): launches keyed alike
    share one choice."""
    return Tuned(name, kernel, list(configs), list(key), prune, hooked)


@contextmanager
def untimed_tiles() -> Iterator[None]:
    """Within the block, launches not tuned yet run the first pruned config, untimed (their
    results are the same bits whatever the tile; only the time differs)."""
    _UNTIMED.append(True)
    try:
        yield
    finally:
        _UNTIMED.pop()


def _bound(tuned: Tuned, args: Args, config: Config) -> Args:
    """`args` as `config` launches them: its pre-hook applied to copies of the hooked ones."""
    if config.pre_hook is None:
        return args
    named = dict(zip(tuned.arg_names, args, strict=False))
    for name in tuned.hooked:
        if named.get(name) is not None:
            named[name] = copy.copy(named[name])
    config.pre_hook({**named, **config.all_kwargs()})
    return tuple(named[n] for n in tuned.arg_names[: len(args)])


def _precompile(tuned: Tuned, args: Args, meta: dict[str, Any], configs: list[Config]) -> int:
    """Compile `configs` for this launch in parallel threads, where Triton can
    (`AsyncCompileMode`); the autotuner then finds them compiled. Returns the threads used
    (1: the autotuner compiles them one by one)."""
    AsyncCompileMode = async_compile_mode()
    if AsyncCompileMode is None:
        return 1
    workers = int(os.environ.get("QUANTSTUDY_TRITON_COMPILE_THREADS", os.cpu_count() or 1))
    threads = min(workers, len(configs))
    if threads < 2:
        return 1
    with ThreadPoolExecutor(max_workers=threads) as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:
                own = _bound(tuned, args, config)
                tuned.kernel.warmup(*own, grid=(1,), **meta, **config.all_kwargs())
    return threads


def _check_key(tuned: Tuned, meta: dict[str, Any]) -> None:
    missing = sorted(set(meta) - set(tuned.keys))
    if missing:
        raise ValueError(
            f"{tuned.name}: compile-time options {missing} are not in the autotuner's key, so "
            "launches that differ only in them would share one tuned choice; add them to it"
        )


def tuned_launch(tuned: Tuned, grid: Grid, args: Args, meta: dict[str, Any]) -> Config:
    """Launch `tuned`'s kernel: the shipped table's choice, else the stored one, where there is
    one (module comment), else tune (compiling the pruned configs in parallel first) and store
    the choice; returns the config it launched."""
    _check_key(tuned, meta)
    configs = tuned.configs
    key = choices.launch_key(tuned, args, meta)
    index = table.lookup(tuned, key, args, meta)
    origin = "table"
    if index is None:
        index, origin = choices.lookup(key, len(configs)), "store"
    named = dict(zip(tuned.arg_names, args, strict=False))
    if index is not None:
        _chosen(tuned, key, origin)
    elif _UNTIMED[-1]:  # not stored: a timed launch of this shape still tunes
        index = configs.index(tuned.prune(configs, named, **meta)[0])
    if index is not None:
        config = configs[index]
        _launcher(tuned, grid, args, meta, config)()
        return config
    start = time.perf_counter()
    pruned = tuned.prune(configs, named, **meta)
    threads = _precompile(tuned, args, meta, pruned)
    compiled = time.perf_counter()
    with timing_lock.timing():  # configs are timed with the GPU held alone (zoo --jobs)
        found = search.fastest(pruned, lambda c: _launcher(tuned, grid, args, meta, c))
    timed = time.perf_counter()
    best = found.best
    _launcher(tuned, grid, args, meta, best)()
    row = {"kernel": tuned.name, **{k: named.get(k, meta.get(k)) for k in tuned.keys}}
    row |= {"configs": len(pruned), "screened": found.screened, "finalists": found.finalists}
    row |= {"failed": found.failed, "threads": threads, "compile_s": round(compiled - start, 3)}
    row |= {"tune_s": round(timed - compiled, 3), "best": str(best), "tile": config_words(best)}
    _log(row)
    choices.store(key, configs.index(best), table.about(tuned, args, meta, best))
    _chosen(tuned, key, "tuned")
    return best


def _launcher(tuned: Tuned, grid: Grid, args: Args, meta: dict[str, Any], config: Config) -> Any:
    """One launch of `tuned`'s kernel with `config`, its arguments bound (a config's own copies
    of the hooked ones)."""
    return functools.partial(
        tuned.kernel[grid], *_bound(tuned, args, config), **meta, **config.all_kwargs()
    )


def _chosen(tuned: Tuned, key: str, origin: str) -> None:
    """Note where a launch's config came from, the first time this process launches it."""
    if key not in _CHOSEN:
        _CHOSEN.add(key)
        CHOICE_LOG.append({"kernel": tuned.name, "origin": origin})


def choice_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """`CHOICE_LOG` rows counted by where their config came from (`ORIGINS`, each present)."""
    counts = dict.fromkeys(ORIGINS, 0)
    for row in rows:
        counts[row["origin"]] += 1
    return counts


def _log(row: dict[str, Any]) -> None:
    TUNE_LOG.append(row)
    log = os.environ.get("QUANTSTUDY_TUNE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kernel: launches tuned, configs compiled and timed, and the seconds of each part."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        total = out.setdefault(
            row["kernel"], {"launches": 0, "configs": 0, "compile_s": 0.0, "tune_s": 0.0}
        )
        total["launches"] += 1
        total["configs"] += row["configs"]
        total["compile_s"] = round(total["compile_s"] + row["compile_s"], 3)
        total["tune_s"] = round(total["tune_s"] + row["tune_s"], 3)
    return out
