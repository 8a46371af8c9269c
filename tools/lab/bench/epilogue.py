"""What the fused FP8 product's epilogue costs per thing it does, one product at a time.

For the products that end a residual block (a 1x1 conv whose output is added to the block's
input, then activated), each epilogue variant timed alone on the GPU from CUDA-graph replays,
autotuned as the engine runs it (`quant/kernels/gemm.py`):

- "residual": the sum and the ReLU in the epilogue, fp16 out (`quant/rewrites/residual.py`);
- "residual + quantize": the same, then the next layer's FP8 input in a separate pass (what an
  engine without sum hand-offs runs; Inductor fuses that pass into other work where it can, so
  this is its cost when it cannot);
- "residual + pair": the FP8 copy written by the same epilogue (`quant/rewrites/sum_handoff.py`);
- "... pointer": the same two with pointer stores only (no tensor-descriptor store), to see
  whether the pair's extra masked pointer store is what costs beside a descriptor store.

The shapes are res2net50_26w_4s's block-ending products at batch 128 (its conv3 of each stage),
where the engine with sum hand-offs measured slower than the one without (docs/fp8-kernel.md,
"The rewrites around the kernel"). Prints a table and writes JSON:

    python tools/lab/bench/epilogue.py --out epilogue.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from quantstudy.bench.epilogue_shapes import EPILOGUE_PROGRAM, SHAPES
from quantstudy.bench.provenance import collect_provenance, need_cuda
from quantstudy.quant.formats.fp8 import E4M3, to_fp8
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import Activation


def _time(fn) -> float:
    from triton.testing import do_bench_cudagraph

    fn()  # tunes the launch outside the graph
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=20)) * 1000.0


def bench(m: int, n: int, k: int, device: torch.device) -> dict[str, float]:
    """Microseconds per call of each epilogue variant (module docstring) for one product."""
    from quantstudy.quant.kernels.gemm import fp8_gemm_triton
    from quantstudy.quant.kernels.tuning import TUNE_LOG

    g = torch.Generator(device=device).manual_seed(0)
    x8 = torch.randn(m, k, device=device, generator=g).to(E4M3)
    w8 = torch.randn(n, k, device=device, generator=g).to(E4M3)
    w_scale = torch.rand(n, device=device, generator=g) / 64
    bias = torch.randn(n, device=device, generator=g)
    one = torch.ones((), device=device)
    out_scale = torch.full((), 0.05, device=device)
    res = torch.randn(m, n, device=device, generator=g).half()
    pair = torch.empty(m, n, device=device, dtype=E4M3)
    args = (x8, w8, w_scale, one, bias, Activation.NONE, torch.float16)
    kw = {"round_to": torch.float16, "residual": res, "res_act": Activation.RELU}
    before = len(TUNE_LOG)
    times = {
        "residual": _time(lambda: fp8_gemm_triton(*args, **kw)),
        "residual + quantize": _time(lambda: to_fp8(fp8_gemm_triton(*args, **kw), out_scale)),
        "residual + pair": _time(
            lambda: fp8_gemm_triton(*args, **kw, out_scale=out_scale, pair=pair)
        ),
        "residual pointer": _time(lambda: fp8_gemm_triton(*args, **kw, store="pointer")),
        "residual + pair pointer": _time(
            lambda: fp8_gemm_triton(*args, **kw, out_scale=out_scale, pair=pair, store="pointer")
        ),
    }
    times["tiles"] = [row["best"] for row in TUNE_LOG[before:]]
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog=EPILOGUE_PROGRAM, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = need_cuda(EPILOGUE_PROGRAM)
    provenance = collect_provenance(device, argv, program=f"python {EPILOGUE_PROGRAM}")
    rows = []
    names = ["residual", "residual + quantize", "residual + pair"]
    names += ["residual pointer", "residual + pair pointer"]
    print("product | M x N x K | " + " | ".join(f"{n} us" for n in names))
    for name, m, n, k in SHAPES:
        t = bench(m, n, k, device)
        rows.append({"product": name, "M": m, "N": n, "K": k, **t})
        cells = " | ".join(f"{t[v]:.1f}" for v in names)
        print(f"{name} | {m} x {n} x {k} | {cells}", flush=True)
    record = {"provenance": provenance.model_dump(mode="json"), "rows": rows}
    write_json_atomic(args.out, record)


if __name__ == "__main__":
    main()
