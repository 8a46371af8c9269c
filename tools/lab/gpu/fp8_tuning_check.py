"""Device check of the FP8 product's tuning paths (`quant/kernels/tuning.py`), worth running before
`tools/lab/bench/study_time.py` (README.md here): for a few Lite0-like products, a cold tune with
serial and with parallel compilation (seconds each), the stored-choice launch and the untimed-
tile launch, each compared bit for bit with the tuned launch. Prints one JSON line per product
and exits 1 when any output differs."""

import json
import os
import sys
import time

import torch

from quantstudy.quant.kernels import gemm as t
from quantstudy.quant.kernels import tuning


def product(m: int, n: int, k: int, act: str, threads: str) -> dict:
    os.environ["QUANTSTUDY_TRITON_COMPILE_THREADS"] = threads
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    ws = torch.rand(n, device="cuda", generator=g) / 100
    xs = torch.tensor(0.02, device="cuda")
    b = torch.randn(n, device="cuda", generator=g)

    def call():
        return t.fp8_gemm_triton(x, w, ws, xs, b, act, torch.float16, round_to=torch.float16)

    with tuning.untimed_tiles():  # before any tuning of this shape: the first pruned tile
        torch.cuda.synchronize()
        s = time.perf_counter()
        untimed = call()
        torch.cuda.synchronize()
        untimed_s = time.perf_counter() - s
    s = time.perf_counter()
    tuned = call()
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - s
    again = call()  # the stored choice, launched directly
    torch.cuda.synchronize()
    row = tuning.TUNE_LOG[-1] if tuning.TUNE_LOG else {}
    return {
        "M": m, "N": n, "K": k, "act": act, "threads": threads,
        "first_call_untimed_s": round(untimed_s, 2), "first_tuned_call_s": round(tune_s, 2),
        "compile_s": row.get("compile_s"), "tune_s": row.get("tune_s"),
        "configs": row.get("configs"), "best": row.get("best"),
        "untimed_equal": bool(torch.equal(untimed, tuned)),
        "stored_equal": bool(torch.equal(again, tuned)),
    }  # fmt: skip


def main() -> int:
    ok = True
    # (M, N, K, act): a Lite0-like projection (K 96 -> N 24, no act) compiled serially and an
    # expansion (K 32 -> N 144, relu6) compiled in parallel (other specializations: both cold)
    for m, n, k, act, threads in [
        (128 * 3136, 24, 96, "none", "1"),
        (128 * 3136, 144, 32, "relu6", "16"),
    ]:
        r = product(m, n, k, act, threads)
        print(json.dumps(r), flush=True)
        ok &= r["untimed_equal"] and r["stored_equal"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
