"""What cuBLASLt's FP8 products accept on this GPU, and how fast: every epilogue and output
type the cuBLASLt backend would use, on ViT-B/16's four linear shapes at batches 1 and 128,
beside torch._scaled_mm and the fp16 product of the same shapes.

Each case is an answer: the heuristic's kernels timed (CUDA-graph replays, median), the
fastest kept, and its output checked against a float32 reference computed from the same FP8
operands (FP8 outputs: the share of e4m3 codes equal and the largest distance in steps; 16-bit
outputs: the largest error relative to the output's range), or NOT_SUPPORTED with the call that
said so. GELU is checked against both forms, tanh and erf, since cuBLASLt documents tanh.

    python -m quantstudy.bench.lt_probe --out lt-probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from quantstudy.cli_base.command import batches
from quantstudy.env.machine import Machine
from quantstudy.gpu.timer import time_us
from quantstudy.quant.cublaslt.library import LtError, unavailable, version
from quantstudy.quant.cublaslt.matmul import LtMatmul
from quantstudy.quant.cublaslt.problem import (
    GELU_EPILOGUES,
    ChannelScale,
    LtEpilogue,
    LtOut,
    Problem,
)

# ViT-B/16's linears, (N, K), and its tokens per image
SHAPES = {"qkv": (2304, 768), "proj": (768, 768), "fc1": (3072, 768), "fc2": (768, 3072)}
TOKENS = 197
# (epilogue, output, fast accumulation, how the per-channel weight scales go in)
Case = tuple[LtEpilogue, LtOut, bool, ChannelScale]
ALPHA, OUTER = ChannelScale.ALPHA_VECTOR, ChannelScale.OUTER_VEC
PER_CHANNEL: list[Case] = [
    (epi, out, True, how)
    for how in (ALPHA, OUTER)
    for epi, out in [
        (LtEpilogue.BIAS, LtOut.FP16),
        (LtEpilogue.BIAS_RESIDUAL, LtOut.FP16),
        (LtEpilogue.GELU_BIAS, LtOut.FP8),
    ]
]
PER_TENSOR: list[tuple[LtEpilogue, LtOut, bool]] = [
    (LtEpilogue.NONE, LtOut.FP16, True),
    (LtEpilogue.NONE, LtOut.FP16, False),
    (LtEpilogue.BIAS, LtOut.FP16, True),
    (LtEpilogue.BIAS_RESIDUAL, LtOut.FP16, True),
    (LtEpilogue.GELU_BIAS, LtOut.FP16, True),
    (LtEpilogue.GELU_BIAS, LtOut.FP8, True),
    (LtEpilogue.GELU_AUX_BIAS, LtOut.FP8, True),
    (LtEpilogue.BIAS, LtOut.FP8, True),
    (LtEpilogue.BIAS_RESIDUAL, LtOut.FP8, True),
]
CASES = [(*case, ChannelScale.NONE) for case in PER_TENSOR] + PER_CHANNEL
E4M3 = torch.float8_e4m3fn


def probe_us(fn: Any, rep: int = 20) -> float:
    """The kernel timer (`gpu/timer.py`) as this probe reads it: the median of CUDA-graph
    replays of `rep` ms of calls, after one eager call (heuristics, lazy loads)."""
    return time_us(fn, rep=rep, stat="median", eager=True)


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (t.abs().amax().float() / 448.0).reshape(1)
    return (t.float() / scale).to(E4M3), scale


def steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """E4M3 codes apart: the codes' magnitude bits are monotonic, the sign bit apart."""

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        u = t.view(torch.uint8).int()
        mag = u & 0x7F
        return torch.where(u >= 0x80, -mag, mag)

    return (ordinal(a) - ordinal(b)).abs()


def reference(
    ops: dict[str, torch.Tensor], epi: LtEpilogue, gelu: str, per_channel: bool
) -> torch.Tensor:
    w8, sw = (ops["w8c"], ops["swc"]) if per_channel else (ops["w8"], ops["sw"])
    y = (ops["x8"].float() @ w8.float().T) * (ops["sx"] * sw)
    if epi is not LtEpilogue.NONE:
        y = y + ops["bias"].float()
    if epi in (LtEpilogue.GELU_BIAS, LtEpilogue.GELU_AUX_BIAS):
        y = F.gelu(y, approximate=gelu)
    if epi is LtEpilogue.BIAS_RESIDUAL:
        y = y + ops["res"].float()
    return y


def compare(got: torch.Tensor, ops: dict[str, torch.Tensor], case: Case) -> dict[str, Any]:
    epi, out, _, how = case
    gelu = epi in GELU_EPILOGUES
    forms = ["tanh", "none"] if gelu else ["none"]
    found: dict[str, Any] = {}
    for form in forms:
        ref = reference(ops, epi, form, how is not ChannelScale.NONE)
        key = "tanh" if form == "tanh" else ("erf" if gelu else "exact")
        if out is LtOut.FP8:
            want = (ref * ops["d_scale"]).clamp(-448, 448).to(E4M3)
            dist = steps(got, want)
            found[key] = {
                "codes_equal": float((dist == 0).float().mean()),
                "max_steps": int(dist.max()),
            }
        else:
            err = (got.float() - ref).abs().max() / ref.abs().max()
            found[key] = {"max_rel_err": float(err)}
    return found


def operands(m: int, n: int, k: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    x8, sx = quantize(x)
    w8, sw = quantize(w)
    swc = (w.abs().amax(dim=1).float() / 448.0).clamp_min(1e-12)
    w8c = (w / swc[:, None]).to(E4M3)
    bias = (torch.randn(n, device="cuda", generator=g) * 0.1).half()
    res = torch.randn(m, n, device="cuda", generator=g).half()
    y = (x8.float() @ w8.float().T) * (sx * sw) + bias.float()
    d_scale = (448.0 / F.gelu(y).abs().amax()).reshape(1).float()
    return {
        "x8": x8,
        "w8": w8,
        "sx": sx,
        "sw": sw,
        "w8c": w8c,
        "swc": swc,
        "alpha": swc * sx,
        "bias": bias,
        "res": res,
        "d_scale": d_scale,
    }


def run_case(ops: dict[str, torch.Tensor], m: int, n: int, k: int, case: Case) -> dict[str, Any]:
    epi, out, fast, how = case
    row: dict[str, Any] = {
        "epilogue": epi.value,
        "out": out.value,
        "fast_accum": fast,
        "channel_scale": how.value,
    }
    try:
        mm = LtMatmul(Problem(m, n, k, epi, out, fast, channel_scale=how))
        d = torch.empty(m, n, device="cuda", dtype=E4M3 if out is LtOut.FP8 else torch.half)
        aux = (
            torch.empty(m, n, device="cuda", dtype=torch.half)
            if epi is LtEpilogue.GELU_AUX_BIAS
            else None
        )
        w8, w_scale = ops["w8"], ops["sw"]
        if how is ChannelScale.ALPHA_VECTOR:
            w8, w_scale = ops["w8c"], ops["alpha"]
        elif how is ChannelScale.OUTER_VEC:
            w8, w_scale = ops["w8c"], ops["swc"]
        mm.bind(w_scale, ops["sx"], ops["bias"], ops["d_scale"], aux)
        c = ops["res"] if epi is LtEpilogue.BIAS_RESIDUAL else None
        times = mm.choose(lambda fn: probe_us(fn, rep=5), w8, ops["x8"], d, c)
        row["candidates_us"] = [round(t, 2) for t in times]
        row["us"] = round(probe_us(lambda: mm.launch(w8, ops["x8"], d, c)), 2)
        mm.launch(w8, ops["x8"], d, c)
        torch.cuda.synchronize()
        row["status"] = "ok"
        row["check"] = compare(d, ops, case)
    except LtError as err:
        row["status"] = "not_supported" if err.not_supported else "error"
        row["why"] = str(err)
    except (RuntimeError, ValueError) as err:
        row["status"] = "error"
        row["why"] = f"{type(err).__name__}: {err}"
    return row


def peers(ops: dict[str, torch.Tensor], m: int, n: int, k: int) -> dict[str, float]:
    """torch._scaled_mm with its bias (fast accumulation, fp16 out) and the fp16 product."""
    x16 = (ops["x8"].float() * ops["sx"]).half()
    w16 = (ops["w8"].float() * ops["sw"]).half()
    w8t = ops["w8"].T
    return {
        "scaled_mm_bias_us": round(
            probe_us(
                lambda: torch._scaled_mm(
                    ops["x8"],
                    w8t,
                    ops["sx"],
                    ops["sw"],
                    bias=ops["bias"],
                    out_dtype=torch.half,
                    use_fast_accum=True,
                )
            ),
            2,
        ),
        "fp16_linear_bias_us": round(probe_us(lambda: F.linear(x16, w16, ops["bias"])), 2),
    }


def environment() -> dict[str, Any]:
    machine = Machine.of(torch.device("cuda"))
    return {
        "gpu": machine.gpu_name,
        "torch": machine.torch,
        "cuda": machine.cuda,
        "triton": machine.triton,
        "cublaslt_version": version(),
        "commit": os.environ.get("QUANTSTUDY_GIT_COMMIT", "unknown"),
        "command": "python -m quantstudy.bench.lt_probe " + " ".join(sys.argv[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=batches, default=(1, 128))
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"lt_probe: {why}", file=sys.stderr)
        return 1
    record: dict[str, Any] = {"kind": "cublaslt-probe", "environment": environment(), "rows": []}
    start = time.time()
    for batch in args.batches:
        for name, (n, k) in SHAPES.items():
            m = TOKENS * batch
            ops = operands(m, n, k)
            ref = peers(ops, m, n, k)
            for case in CASES:
                row = {"shape": name, "batch": batch, "m": m, "n": n, "k": k, **ref}
                row.update(run_case(ops, m, n, k, case))
                record["rows"].append(row)
                print(json.dumps(row), flush=True)
            record["wall_s"] = round(time.time() - start, 1)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
