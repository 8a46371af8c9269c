"""Where a packaged FP8 engine departs from the study's: one study, one static batch, by stage.

`quantstudy package --check` says whether the package agrees with the study's FP8 engine; this
says where a disagreement enters. On the held-out images, each stage's logits are compared with
the study's FP8 engine (compiled as the study compiled it, every tile's bits alike):

1. the study's eager FP8 module (the module that is exported);
2. the exported program with its FP8 ops pointed at the packaged ops, run eagerly with the
   package's tiles (`package/graph.py`, `quant/kernels/launches.py`): those and the tiles, no
   Inductor;
3. AOTInductor packages of that program under each Inductor configuration named (`default`:
   the configuration `quantstudy package` compiles with), loaded in this process.

Each package's generated C++ wrapper (its buffer layouts and kernel launches) is copied to
$OUT, and the CUDA kernel time per kernel of the study's fp16 and FP8 engines and of each
package is profiled (top kernels), for the speed side of the same question. Writes
$OUT/package-diagnose.json after each batch; prints a table.

Run from the repository root with quantstudy importable (PYTHONPATH=src) and torch's libstdc++
preloaded (packages load in this process: `package/loader.py: loader_env`), e.g.:
  LD_PRELOAD=... python tools/lab/gpu/package_diagnose.py --model lite0 --data D/val-1300 \
      --class-list D/classes.txt --calib 100 --heldout 200 --batches 128,1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from package_bench import _provenance, models, record_name

# Inductor options tried on top of `quantstudy package`'s own (`build.inductor_configs`).
CONFIGS: dict[str, dict[str, object]] = {  # `no-padding`: Inductor's stride padding off
    "default": {},
    "no-padding": {"comprehensive_padding": False},
}


def _study(args: argparse.Namespace, work: Path) -> Path:
    entry = models()[args.model]
    model, weights, recipe = entry.name, entry.weights or "random", entry.recipe
    out = work / f"study-{args.model}"
    if (out / "study.json").is_file():
        return out
    cmd = [sys.executable, "-m", "quantstudy.cli", "run", model, "--weights", weights]
    cmd += ["--device", "cuda", "--batches", args.batches, "--calib", str(args.calib)]
    cmd += ["--heldout", str(args.heldout), "--data", str(args.data), "--out", str(out)]
    cmd += ["--no-speed"] + (["--recipe", recipe] if recipe else [])
    cmd += ["--class-list", str(args.class_list)] if args.class_list else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not (out / "study.json").is_file():
        raise SystemExit(f"the study did not finish ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


def _logits(fn, x: torch.Tensor, batch: int, prepare) -> torch.Tensor:
    """float32 logits of `fn` on `x` in static batches (the tail filled with its first image)."""
    outs = []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            chunk = x[i : i + batch]
            n = chunk.shape[0]
            if n < batch:
                chunk = torch.cat([chunk, chunk[:1].expand(batch - n, *chunk.shape[1:])])
            outs.append(fn(prepare(chunk)).float().cpu()[:n])
    return torch.cat(outs)


def _against(got: torch.Tensor, want: torch.Tensor) -> dict:
    """How far `got` is from the study's engine: images whose top-1 differs, KL, logits."""
    from quantstudy.bridge.check import compare

    found = compare(got, want)
    return {
        "differ": found.differ_count,
        "kl_mean": found.kl_mean,
        "max_abs_logit_diff": found.max_abs_logit_diff,
        "bitwise_equal": bool(torch.equal(got, want)),
        "nonfinite": int((~torch.isfinite(got).all(dim=1)).sum()),
    }


def _kernel_times(fn, x: torch.Tensor, calls: int = 10, top: int = 12) -> list[dict]:
    """CUDA time per kernel name over `calls` calls after warm-up (profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append(
                {"kernel": e.key[:90], "us_per_call": us / calls, "count": e.count // calls}
            )
    rows.sort(key=lambda r: -r["us_per_call"])
    total = sum(r["us_per_call"] for r in rows)
    every = {"kernel": "(all)", "us_per_call": total, "count": sum(r["count"] for r in rows)}
    return [every, *rows[:top]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=record_name, choices=sorted(models()), default="lite0")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--class-list", type=Path)
    p.add_argument("--calib", type=int, default=100)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--batches", default="128", help="static batches, in this order")
    p.add_argument("--configs", default="default")
    p.add_argument("--work", type=Path, default=Path("/tmp/package-diagnose"))
    args = p.parse_args()
    from quantstudy.bridge.rebuild import load_set, rebuild
    from quantstudy.package.build import build_engines
    from quantstudy.record.load import RECORD_FILE, load_record

    out_dir = Path(os.environ.get("OUT", "."))
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    study = _study(args, args.work)
    record = load_record(study / RECORD_FILE)
    result: dict = {"provenance": _provenance(), "model": args.model, "batches": {}}
    result["study_s"] = round(time.perf_counter() - t0, 1)
    engines = build_engines(rebuild(record, args.data), torch.device("cuda"))
    x, _ = load_set(study, record, record.data.heldout, args.data)
    result["images"] = x.shape[0]
    for batch in (int(b) for b in args.batches.split(",")):
        found = _diagnose(args, record, engines, x, batch, out_dir)
        result["batches"][str(batch)] = found
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        (out_dir / "package-diagnose.json").write_text(json.dumps(result, indent=1))
        _print(args.model, batch, x.shape[0], found)
    return 0


def _diagnose(args, record, engines, x: torch.Tensor, batch: int, out_dir: Path) -> dict:
    """The stages of one static batch against the study's FP8 engine, and kernel times."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    from quantstudy.package.build import choose_tiles, inductor_configs
    from quantstudy.package.graph import export_engine, retarget
    from quantstudy.quant.kernels.launches import replaying
    from quantstudy.quant.kernels.tuning import untimed_tiles

    fp8 = engines.fp8
    found: dict = {}
    table = choose_tiles(fp8, x[: min(32, x.shape[0])], [batch])
    found["tiles"] = len(table.tiles)
    found["tma_replaced"] = table.tma_replaced
    with untimed_tiles():
        want = _logits(fp8.module, x, batch, fp8.prepare)
        stages = {"study eager module": _logits(fp8.eager, x, batch, fp8.prepare)}
    example = fp8.prepare(x[:batch])
    program = export_engine(fp8.eager, example, None)
    found["retargeted"] = retarget(program)
    with replaying(table):
        stages["exported, packaged ops eager"] = _logits(program.module(), x, batch, fp8.prepare)
    timing_x = fp8.prepare(x[:batch])
    half = engines.fp16
    with untimed_tiles():
        found["kernels"] = {
            "study fp16 engine": _kernel_times(half.module, half.prepare(x[:batch])),
            "study FP8 engine": _kernel_times(fp8.module, timing_x),
        }
    base = inductor_configs(record)
    for name in args.configs.split(","):
        path = args.work / f"fp8-b{batch}-{name}.pt2"
        start = time.perf_counter()
        program = export_engine(fp8.eager, example, None)
        retarget(program)
        with replaying(table), torch.no_grad():
            aoti_compile_and_package(
                program, package_path=str(path), inductor_configs=base | CONFIGS[name]
            )
        found[f"compile_s {name}"] = round(time.perf_counter() - start, 1)
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if member.endswith("wrapper.cpp"):
                    (out_dir / f"b{batch}-{name}-wrapper.cpp").write_bytes(z.read(member))
        model = aoti_load_package(str(path), run_single_threaded=True)
        stages[f"package {name}"] = _logits(model, x, batch, fp8.prepare)
        found["kernels"][f"FP8 package {name}"] = _kernel_times(model, timing_x)
        del model
    found["stages"] = {stage: _against(got, want) for stage, got in stages.items()}
    return found


def _print(model: str, batch: int, n: int, found: dict) -> None:
    print(f"{model} b{batch}: {n} images; tiles {found['tiles']}, TMA moved "
          f"{found['tma_replaced']}; ops {found['retargeted']}")  # fmt: skip
    print(f"{'stage':<28} {'differ':>6} {'KL mean':>10} {'max |dlogit|':>12} {'bitwise':>7}")
    for stage, r in found["stages"].items():
        print(f"{stage:<28} {r['differ']:>6} {r['kl_mean']:>10.3g} "
              f"{r['max_abs_logit_diff']:>12.4g} {r['bitwise_equal']!s:>7}")  # fmt: skip
    for who, rows in found["kernels"].items():
        print(f"{who}: {rows[0]['us_per_call']:.0f} us of kernels per call, {rows[0]['count']} "
              "launches; top:")  # fmt: skip
        for r in rows[1:5]:
            print(f"   {r['us_per_call']:8.1f} us x{r['count']:<3} {r['kernel'][:70]}")


if __name__ == "__main__":
    sys.exit(main())
