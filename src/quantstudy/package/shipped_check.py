"""Run and time the packages of a `quantstudy package` folder with torch alone.

Shipped beside the packages (`check.py`) and run by path, `python -I check.py PKG_DIR ...`: it
imports nothing from quantstudy, and refuses to (an import hook below), so that a package that
secretly called back into quantstudy fails here instead of passing. What it does:

1. Reads `manifest.json` and compares what the packages are bound to (device type, GPU, torch,
   CUDA) with this machine: a difference is one line on stderr and exit status 2, before any
   package is loaded (a package compiled for another GPU or torch can crash the process).
2. `--images FILE` (a float32 NCHW tensor saved with `torch.save`, preprocessed as the manifest
   says; default: the manifest's sample images): runs them through the FP8 package of the
   largest batch (or the dynamic one) and saves float32 logits to `--logits FILE`;
   `--each-logits FILE` runs them through every FP8 package and saves {file: logits}.
3. `--time`: the FP8 package against the fp16 package at each batch, as the study's harness
   times engines: each call captured in a CUDA graph and replayed, `iters` replays between two
   CUDA events per round, rounds of the two alternating in ABBA order, median per engine and
   the median of the per-round ratios fp16 / FP8 (x). A package whose call cannot be captured
   is timed by eager calls, and the record says which engine and why (`engines`).
4. `--out FILE`: everything measured, as JSON.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import stat
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BOUND_EXIT = 2
INPUT_EXIT = 1  # the folder holds no readable manifest
Model = Callable[[Any], Any]  # a loaded package: called with a batch, returns its logits


class _RefuseQuantstudy(importlib.abc.MetaPathFinder):
    """Any import of quantstudy in this process fails: the package must not need it."""

    def find_spec(
        self,
        name: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "quantstudy" or name.startswith("quantstudy."):
            raise ImportError(f"{name}: quantstudy is not importable in a package check")
        return None


sys.meta_path.insert(0, _RefuseQuantstudy())

import torch  # noqa: E402  (after the hook: nothing torch loads may import quantstudy)


def machine(device: str) -> dict[str, str]:
    """What a package is bound to, as this machine has it (`manifest.bound_to`'s keys)."""
    bound = {"device": device, "torch": torch.__version__}
    if device == "cuda":
        bound["cuda"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            bound["gpu"] = torch.cuda.get_device_name()
            bound["capability"] = f"{major}.{minor}"
        else:
            bound["gpu"] = "no CUDA GPU"
            bound["capability"] = "none"
    return bound


def binding_problem(manifest: dict[str, Any]) -> str | None:
    """The first difference between what the packages are bound to and this machine."""
    wanted = manifest["bound_to"]
    here = machine(wanted["device"])
    for key, value in wanted.items():
        if here.get(key) != value:
            return (
                f"the packages were built for {key} {value}, this machine has "
                f"{here.get(key)}; rebuild them here with `quantstudy package`"
            )
    return None


def load(folder: Path, entry: dict[str, Any]) -> Model:
    """The package, with AOTInductor's single-threaded runner: the default runner synchronizes
    between calls for callers on several threads, which conflicts with a CUDA graph capture
    (`aoti_load_package` documents `run_single_threaded` as "useful to avoid conflicts with
    CUDAGraphs"); this script calls from one thread."""
    from torch._inductor import aoti_load_package

    model: Model = aoti_load_package(str(folder / entry["file"]), run_single_threaded=True)
    return model


def prepared(x: torch.Tensor, manifest: dict[str, Any]) -> torch.Tensor:
    """Float32 NCHW images in the packages' device, dtype and memory format."""
    spec = manifest["input"]
    x = x.to(manifest["bound_to"]["device"], getattr(torch, spec["dtype"]))
    if spec["memory_format"] == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def run_images(
    model: Model, entry: dict[str, Any], images: torch.Tensor, manifest: dict[str, Any]
) -> torch.Tensor:
    """Float32 logits of `images`, in chunks of the package's batch (a static package takes
    exactly its batch: the last chunk is filled up with its first image and cut back)."""
    batch = entry["batch"] or entry["max_batch"]
    outs = []
    with torch.no_grad():
        for i in range(0, images.shape[0], batch):
            chunk = images[i : i + batch]
            n = chunk.shape[0]
            if entry["batch"] and n < batch:
                chunk = torch.cat([chunk, chunk[:1].expand(batch - n, *chunk.shape[1:])])
            outs.append(model(prepared(chunk, manifest)).float().cpu()[:n])
    return torch.cat(outs)


def _graphed(
    model: Model, x: torch.Tensor, warmup: int
) -> tuple[Callable[[], None] | None, str | None]:
    """A replay function of `model(x)` captured in a CUDA graph, after eager warm-up calls on
    a side stream (PyTorch's capture recipe), and None; or None and why the call could not be
    captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(max(warmup, 3)):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph), torch.no_grad():
            keep = model(x)
    except RuntimeError as failed:
        return None, (str(failed).strip().splitlines() or ["(no message)"])[0][:300]

    def replay(kept: tuple[Any, Any] = (graph, keep)) -> None:  # the graph, its outputs kept
        kept[0].replay()

    return replay, None


def _round(fn: Callable[[], None], iters: int, device: str) -> float:
    """ms per call over one round of `iters` calls."""
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / iters


def time_pair(
    fp16: Model, fp8: Model, x: torch.Tensor, rounds: int, iters: int, device: str
) -> dict[str, Any]:
    """The two packages timed in alternating rounds (ABBA), as the study's harness times."""
    method = "CUDA graph replay, CUDA events" if device == "cuda" else "host clock"
    calls: dict[str, Callable[[], None]] = {}
    engines: dict[str, str] = {}
    for name, model in (("fp16", fp16), ("fp8", fp8)):
        replay, why = _graphed(model, x, 10) if device == "cuda" else (None, None)
        engines[name] = "CUDA graph replay" if replay is not None else "host clock"
        if replay is None:
            if device == "cuda":
                method = "eager calls (a package would not capture), CUDA events"
                engines[name] = f"eager calls: the capture failed: {why}"

            def eager(model: Model = model) -> None:
                with torch.no_grad():
                    model(x)

            replay = eager
            replay()
        calls[name] = replay
    times: dict[str, list[float]] = {"fp16": [], "fp8": []}
    for r in range(rounds):
        for name in ("fp16", "fp8") if r % 2 == 0 else ("fp8", "fp16"):
            times[name].append(_round(calls[name], iters, device))
    ratios = [a / b for a, b in zip(times["fp16"], times["fp8"], strict=True)]
    return {
        "method": method,
        "engines": engines,
        "rounds": rounds,
        "iters": iters,
        "fp16_ms": statistics.median(times["fp16"]),
        "fp8_ms": statistics.median(times["fp8"]),
        "x": statistics.median(ratios),
        "x_q1_q3": [*statistics.quantiles(ratios, n=4)[::2]] if len(ratios) > 1 else ratios * 2,
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the folder `quantstudy package` wrote")
    p.add_argument("--images", type=Path, help="float32 NCHW images (torch.save)")
    p.add_argument("--logits", type=Path, help="write the FP8 package's float32 logits here")
    p.add_argument("--each-logits", type=Path, help="write every FP8 package's, by file")
    p.add_argument("--time", action="store_true", help="time FP8 against fp16 per batch")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, help="write what was measured here (JSON)")
    return p.parse_args(argv)


def read_manifest(folder: Path) -> dict[str, Any] | str:
    """`folder`'s manifest.json, or why it cannot be read, in one line. Opened without blocking
    and refused unless a regular file: a pipe in its place would block the check (quantstudy's
    own readers do the same, `record/readers.py`, which this script may not import)."""
    path = folder / "manifest.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}; give the folder `quantstudy package` wrote"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return f"{path} is not a file; give the folder `quantstudy package` wrote"
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    try:
        manifest = json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        return f"{path} is not valid JSON ({e}); package the study again"
    if not isinstance(manifest, dict):
        return f"{path} is not a package manifest (a JSON object); package the study again"
    return manifest


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    manifest = read_manifest(args.folder)
    if isinstance(manifest, str):
        print(f"package check: error: {manifest}", file=sys.stderr)
        return INPUT_EXIT
    problem = binding_problem(manifest)
    if problem is not None:
        print(f"package check: error: {problem}", file=sys.stderr)
        return BOUND_EXIT
    torch.manual_seed(0)
    device = manifest["bound_to"]["device"]
    result: dict[str, Any] = {"machine": machine(device), "load_s": {}, "timing": {}}
    fp8_entries = [e for e in manifest["packages"] if e["engine"] == "fp8"]
    widest = max(fp8_entries, key=lambda e: e["batch"] or e["max_batch"])
    if args.logits is not None or args.each_logits is not None:
        images = torch.load(args.images or args.folder / manifest["sample"]["file"])
        each = {}
        for entry in fp8_entries if args.each_logits is not None else [widest]:
            start = time.perf_counter()
            model = load(args.folder, entry)
            result["load_s"][entry["file"]] = time.perf_counter() - start
            each[entry["file"]] = run_images(model, entry, images, manifest)
            del model
        nonfinite = torch.zeros(images.shape[0], dtype=torch.bool)
        for logits in each.values():  # an image counts once, whichever package failed it
            nonfinite |= ~torch.isfinite(logits).all(dim=1)
        result["nonfinite"] = int(nonfinite.sum())
        if args.logits is not None:
            torch.save(each[widest["file"]], args.logits)
        if args.each_logits is not None:
            torch.save(each, args.each_logits)
    if args.time:
        sample = torch.load(args.folder / manifest["sample"]["file"])
        for entry in fp8_entries:
            twin = next(e for e in manifest["packages"] if e["twin_of"] == entry["file"])
            for batch in entry["timed_batches"]:
                reps = -(-batch // sample.shape[0])
                x = prepared(sample.repeat(reps, 1, 1, 1)[:batch], manifest)
                start = time.perf_counter()
                fp8, fp16 = load(args.folder, entry), load(args.folder, twin)
                result["load_s"][f"{entry['file']}+{twin['file']}"] = time.perf_counter() - start
                timed = time_pair(fp16, fp8, x, args.rounds, args.iters, device)
                result["timing"][str(batch)] = timed
                print(f"batch {batch}: fp16 {timed['fp16_ms']:.4f} ms, FP8 {timed['fp8_ms']:.4f} "
                      f"ms, x {timed['x']:.3f} ({timed['method']})")  # fmt: skip
                del fp8, fp16
    result["quantstudy_imported"] = any(m.split(".")[0] == "quantstudy" for m in sys.modules)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
