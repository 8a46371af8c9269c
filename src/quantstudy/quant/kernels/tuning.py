"""The fused FP8 product's tuning cache: how a study avoids paying the autotuner twice.

Kept apart from the launcher because it is process state (a log, a flag stack, a disk file),
not arithmetic: a launch with `tile=None` goes through `tuned_launch`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import triton

from quantstudy.quant.kernels.gemm_kernel import AUTOTUNE_KEY, _fp8_gemm_kernel, _fp8_gemm_tuned
from quantstudy.quant.kernels.tiles import Config, _prune, _set_block_shapes

Args = tuple[Any, ...]  # a kernel's positional arguments (tensors, descriptors, sizes)
Grid = Callable[[dict[str, Any]], tuple[Any, ...]]  # launch grid from a config's meta

# --- What the autotuner costs, and how a study avoids paying it twice -----------------------
#
# Each distinct launch (M, N, K, epilogue, I/O paths) is autotuned once per process: every
# pruned config is compiled (serially, by Triton) and timed from a CUDA graph. An engine sees
# one M per layer shape and batch size, so a study's FP8 engine tunes each layer shape at each
# of its batches, and Triton's own disk cache of tuning results refuses configs with a pre-hook
# (ours sets the descriptors' block shapes). Three things keep that to what the study needs:
#
# 1. The choice is stored per GPU, Triton version and kernel source in a JSON file beside the
#    Inductor cache (`tuning_cache_path`): a later process launches the stored config directly.
# 2. On a miss the pruned configs are compiled in parallel threads first (Triton's
#    `AsyncCompileMode`, where the installed Triton has it), then timed as before.
# 3. Within `untimed_tiles()` a launch that was never tuned takes the first pruned config
#    without timing: for the quality passes, whose outputs do not depend on the tile (every
#    tile and path promotes the sums at the same K, `_mma`), so only the timed batches tune.
#
# `TUNE_LOG` lists each launch the autotuner timed in this process, also appended as JSON lines
# to `$QUANTSTUDY_TUNE_LOG` where set (`tools/bench/study_time.py`).

TUNE_LOG: list[dict[str, Any]] = []
_UNTIMED: list[bool] = [False]
_STORED: dict[str, dict[str, Any]] | None = None


@contextmanager
def untimed_tiles() -> Iterator[None]:
    """Within the block, launches not tuned yet run the first pruned config, untimed (their
    results are the same bits whatever the tile; only the time differs)."""
    _UNTIMED.append(True)
    try:
        yield
    finally:
        _UNTIMED.pop()


def tuning_cache_path() -> Path:
    """Beside Inductor's cache (`engines/builders.py` sets its directory), as the per-layer
    kernel choice is."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    base = Path(root).parent if root else Path.home() / ".cache" / "quantstudy"
    return base / "fp8_gemm_tuning.json"


@functools.cache
def _space_id(device_index: int) -> str:
    """GPU, Triton and the kernel's source and config list: a stored choice is valid only
    under all four."""
    import hashlib

    fn = _fp8_gemm_kernel
    configs = "|".join(str(c) for c in _fp8_gemm_tuned.configs)
    blob = f"{fn.cache_key}|{configs}".encode()
    gpu = torch.cuda.get_device_name(device_index)
    return f"{gpu}|triton {triton.__version__}|{hashlib.sha256(blob).hexdigest()[:16]}"


def _stored() -> dict[str, dict[str, Any]]:
    global _STORED
    if _STORED is None:
        path = tuning_cache_path()
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):  # a damaged cache is a cold one
            data = {}
        _STORED = data if isinstance(data, dict) else {}
    return _STORED


def _store(key: str, config_index: int) -> None:
    from quantstudy.record.io import write_json_atomic

    stored = _stored()
    stored[key] = {"config": config_index}
    path = tuning_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        on_disk = json.loads(path.read_text()) if path.is_file() else {}
        merged = {**(on_disk if isinstance(on_disk, dict) else {}), **stored}
        write_json_atomic(path, merged)
    except (OSError, ValueError):
        pass  # not stored: the next process tunes again


def _launch_key(args: Args, meta: dict[str, Any], tensors: tuple[torch.Tensor, ...]) -> str:
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    values = [named.get(k, meta.get(k)) for k in AUTOTUNE_KEY]
    values += [meta["ROUND"], *(str(t.dtype) for t in tensors)]
    values += [t.stride(0) % 16 == 0 for t in tensors]
    return json.dumps([_space_id(tensors[0].device.index or 0), values])


def _with_block_shapes(descs: dict[str, Any], config: Config) -> dict[str, Any]:
    """Descriptors (copies) carrying `config`'s tile, as its pre-hook would set them."""
    own = {name: copy.copy(d) if d is not None else None for name, d in descs.items()}
    _set_block_shapes({**own, **config.kwargs})
    return own


def _args_with(args: Args, descs: dict[str, Any]) -> Args:
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    named.update({k: v for k, v in descs.items() if k in named})
    return tuple(named[n] for n in _fp8_gemm_tuned.arg_names[: len(args)])


def _precompile(
    grid: Grid, args: Args, descs: dict[str, Any], meta: dict[str, Any], configs: list[Config]
) -> None:
    """Compile `configs` for this launch in parallel threads, where Triton can
    (`AsyncCompileMode`); the autotuner then finds them compiled."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # older Triton: the autotuner compiles them one by one
        return
    workers = int(os.environ.get("QUANTSTUDY_TRITON_COMPILE_THREADS", os.cpu_count() or 1))
    if workers < 2 or len(configs) < 2:
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(configs))) as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:
                own = _args_with(args, _with_block_shapes(descs, config))
                _fp8_gemm_kernel.warmup(*own, grid=(1,), **meta, **config.all_kwargs())


def _tuned_launch(
    grid: Grid,
    args: Args,
    descs: dict[str, Any],
    meta: dict[str, Any],
    tensors: tuple[torch.Tensor, ...],
) -> Config:
    """Launch the autotuned kernel: the stored choice where there is one (module comment),
    else tune (compiling the configs in parallel first) and store the choice; returns the
    config it launched."""
    key = _launch_key(args, meta, tensors)
    entry = _stored().get(key)
    configs = _fp8_gemm_tuned.configs
    index = entry.get("config") if isinstance(entry, dict) else None
    if not (isinstance(index, int) and 0 <= index < len(configs)) and _UNTIMED[-1]:
        named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
        pruned = _prune(configs, named, **meta)
        index = configs.index(pruned[0])
        entry = None  # not stored: a timed launch of this shape still tunes
    if isinstance(index, int) and 0 <= index < len(configs):
        config = configs[index]
        own = _args_with(args, _with_block_shapes(descs, config))
        _fp8_gemm_kernel[grid](*own, **meta, **config.all_kwargs())
        return config
    start = time.perf_counter()
    named = dict(zip(_fp8_gemm_tuned.arg_names, args, strict=False))
    pruned = _prune(configs, named, **meta)
    _precompile(grid, args, descs, meta, pruned)
    compiled = time.perf_counter()
    _fp8_gemm_tuned[grid](*args, **meta)
    best = _fp8_gemm_tuned.best_config
    row = {
        "M": named["M"],
        "N": named["N"],
        "K": named["K"],
        "configs": len(pruned),
        "compile_s": round(compiled - start, 3),
        "tune_s": round(time.perf_counter() - compiled, 3),
        "best": str(best),
    }
    TUNE_LOG.append(row)
    log = os.environ.get("QUANTSTUDY_TUNE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
    _store(key, configs.index(best))
    return best
