"""Device check of the kxk and depthwise convs' tuning (`quant/kernels/tuning.py`): each model's
distinct dense kxk and depthwise conv shapes at each batch, launched as the FP8 engine launches
them, first cold (an empty tuning store and Triton cache) and then warm (what the cold process
left), each phase in a process of its own:

    python tools/lab/gpu/conv_tuning_check.py --out $OUT/conv-tuning.json \\
        [--models resnet50,tf_efficientnet_lite0] [--batches 1,128] [--sweep]

Cold, per model and batch: the untimed pass (what a study's quality passes pay: the first pruned
tile, compiled), then the tuned pass (what a timed batch pays: the pruned configs compiled in
parallel and timed), then every kept tile launched fixed and the stored choice launched again,
each compared bit for bit with the tuned output. Warm: the first pass finds the stored choices,
and must write the cold tuned pass's bits. Prints one line per model and phase and writes the
figures with provenance to --out; exits 1 when any output differs. With --sweep it times every
tile of the tables instead (`sweep`): what the bound on the tiles a launch tries costs in speed.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from quantstudy.bench.conv_tuning import Conv, compare_phases, model_convs

Launch = Callable[..., torch.Tensor]  # launch(tile=None) -> the layer's output
E4M3 = torch.float8_e4m3fn
DEVICE = "cuda"


def launcher(conv: Conv, batch: int, seed: int) -> tuple[Launch, list[tuple[int, ...]]]:
    """The layer's launch on random FP8 data (the same bits in every process), and the tiles its
    prune keeps (fixed-tile form, best ranked first)."""
    from quantstudy.quant.kernels.conv import FP8_CONV, fp8_conv2d_triton
    from quantstudy.quant.kernels.depthwise import DEPTHWISE, depthwise_taps

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    (h, w), (kh, kw), c, n = conv.hw, conv.kernel, conv.cin, conv.cout
    x = torch.randn(batch, c, h, w, device=DEVICE, generator=g).to(E4M3)
    x = x.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(n, device=DEVICE, generator=g)
    x_scale = torch.tensor(0.02, device=DEVICE)
    if conv.depthwise:
        taps = torch.randn(kh * kw, c, device=DEVICE, generator=g).to(E4M3)
        w_scale = torch.rand(c, device=DEVICE, generator=g) / 50
        sizes = {"P": batch * conv.out[0] * conv.out[1], "C": c}
        kept = DEPTHWISE.prune(DEPTHWISE.configs, sizes)

        def launch(tile: tuple[int, ...] | None = None) -> torch.Tensor:
            return depthwise_taps(
                x, taps, conv.kernel, bias, conv.stride[0], conv.pad, conv.out, "relu6",
                x_scale, None, torch.float16, tile, w_scale,
            )  # fmt: skip

        return launch, [(*_blocks(k), k.num_warps) for k in kept]
    w8 = torch.randn(n, kh * kw * c, device=DEVICE, generator=g).to(E4M3)
    w_scale = torch.rand(n, device=DEVICE, generator=g) / 50
    sizes = {"M": batch * conv.out[0] * conv.out[1], "N": n, "CIN": c}
    kept = FP8_CONV.prune(FP8_CONV.configs, sizes)

    def launch(tile: tuple[int, ...] | None = None) -> torch.Tensor:
        return fp8_conv2d_triton(
            x, w8, conv.kernel, w_scale, x_scale, bias, "relu", torch.float16, conv.stride,
            conv.pad, conv.dilation, round_to=torch.float16, tile=tile,
        )  # fmt: skip

    return launch, [(*_blocks(k), k.num_warps, k.num_stages) for k in kept]


def _blocks(config: Any) -> tuple[int, ...]:
    return tuple(v for k, v in config.kwargs.items() if k.startswith("BLOCK_"))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def timed_pass(launches: list[Launch]) -> tuple[float, list[torch.Tensor]]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = [launch() for launch in launches]
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 3), outs


def phase(cold: bool, models: list[str], batches: list[int]) -> dict:
    """One process's passes (module docstring); per model and batch: seconds, tuning, digests."""
    from quantstudy.quant.kernels import choices, tuning

    result: dict = {}
    for model in models:
        convs = model_convs(model)
        for batch in batches:
            before = len(tuning.TUNE_LOG)
            made = [launcher(c, batch, seed=i) for i, c in enumerate(convs)]
            launches = [launch for launch, _ in made]
            row: dict = {"layers": len(convs), "kxk": sum(not c.depthwise for c in convs)}
            if cold:
                with tuning.untimed_tiles():
                    row["untimed_pass_s"], untimed = timed_pass(launches)
            row["first_pass_s"], outs = timed_pass(launches)
            row["tuning"] = tuning.summary(tuning.TUNE_LOG[before:])
            row["digests"] = [digest(o) for o in outs]
            if cold:
                row["untimed_equal"] = all(map(torch.equal, untimed, outs))
                row["every_kept_tile_equal"] = all(
                    torch.equal(launch(tile=tile), out)
                    for (launch, kept), out in zip(made, outs, strict=True)
                    for tile in kept
                )
                choices.forget()  # what a new process finds: the file
                row["stored_equal"] = all(map(torch.equal, (m() for m in launches), outs))
            result[f"{model} batch {batch}"] = row
    return result


def sweep(models: list[str], batches: list[int]) -> dict:
    """Every tile of each conv's table timed alone (CUDA-graph replays): per model and batch, the
    sum over its layers of the best kept tile's time against the best tile's of the whole
    table: what the bound on a cold tune costs in speed, where it costs any."""
    import triton
    from triton.runtime.errors import OutOfResources

    from quantstudy.quant.kernels import conv as kxk
    from quantstudy.quant.kernels import depthwise

    result: dict = {}
    for model in models:
        convs = model_convs(model)
        for batch in batches:
            layers = []
            for i, c in enumerate(convs):
                launch, kept = launcher(c, batch, seed=i)
                us: dict[str, float] = {}
                for tile in depthwise.TILES if c.depthwise else kxk.TILES:
                    try:
                        ms = triton.testing.do_bench_cudagraph(partial(launch, tile=tile), rep=20)
                    except OutOfResources:  # the tile's shared memory does not fit: not run
                        continue
                    us[str(tile)] = round(1000 * ms, 2)
                row = {"conv": asdict(c), "us": us, "kept": [str(t) for t in kept]}
                row["kept_best_us"] = min(us[str(t)] for t in kept if str(t) in us)
                layers.append({**row, "table_best_us": min(us.values())})
            kept_sum = sum(r["kept_best_us"] for r in layers)
            table_sum = sum(r["table_best_us"] for r in layers)
            result[f"{model} batch {batch}"] = {
                "kept_sum_us": round(kept_sum, 2), "table_sum_us": round(table_sum, 2),
                "kept_over_table": round(kept_sum / table_sum, 3), "layers": layers,
            }  # fmt: skip
            print(f"{model} batch {batch}: best kept tiles {kept_sum:.0f} us, best of the table "
                  f"{table_sum:.0f} us ({kept_sum / table_sum:.3f}x)", flush=True)  # fmt: skip
    return result


def _child(phase_name: str, args: argparse.Namespace, cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    env |= {"TRITON_CACHE_DIR": str(cache / "triton"), "PYTHONUNBUFFERED": "1"}
    env["QUANTSTUDY_TUNE_LOG"] = str(cache / f"{phase_name}-tuning.jsonl")
    command = [sys.executable, __file__, "--phase", phase_name, "--models", args.models]
    command += ["--batches", args.batches, "--out", str(args.out)]
    start = time.perf_counter()
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{phase_name} phase failed:\n{run.stderr[-3000:]}")
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    return {"wall_s": round(time.perf_counter() - start, 2), "runs": json.loads(lines[-1][7:])}


def _provenance(args: argparse.Namespace) -> dict:
    import timm
    import triton

    return {
        "command": "python tools/lab/gpu/conv_tuning_check.py " + " ".join(sys.argv[1:]),
        "commit": os.environ.get("QUANTSTUDY_GIT_COMMIT"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__, "timm": timm.__version__,
        "compile_threads": os.environ.get("QUANTSTUDY_TRITON_COMPILE_THREADS", os.cpu_count()),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="JSON record to write")
    p.add_argument("--models", default="resnet50,tf_efficientnet_lite0")
    p.add_argument("--batches", default="1,128")
    p.add_argument("--sweep", action="store_true", help="time every tile instead (`sweep`)")
    p.add_argument("--phase", choices=("cold", "warm"), help=argparse.SUPPRESS)
    args = p.parse_args()
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    if args.phase:
        print("RESULT " + json.dumps(phase(args.phase == "cold", models, batches)), flush=True)
        return 0
    from quantstudy.record.io import write_json_atomic

    record: dict = {"provenance": _provenance(args)}
    if args.sweep:
        record |= {"what": " ".join(str(sweep.__doc__).split())}
        write_json_atomic(args.out, {**record, "sweep": sweep(models, batches)})
        return 0
    cache = Path(tempfile.mkdtemp(prefix="conv-tuning-"))
    phases = {name: _child(name, args, cache) for name in ("cold", "warm")}
    ok = compare_phases(phases)
    record |= {"what": " ".join(__doc__.split("\n\n")[0].split()), "ok": ok}
    write_json_atomic(args.out, {**record, "phases": phases})
    print(f"every tuned path wrote the same bits: {ok}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
