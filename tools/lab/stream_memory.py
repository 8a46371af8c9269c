"""Peak host memory of the streamed held-out pass at two sizes, on the CPU, in minutes.

    python tools/lab/stream_memory.py VARIANTS --sizes 1000,10000 \\
        --out docs/results/scale/<name>.json

Each size runs in its own process (one torch thread): timm's `test_efficientnet` with random
weights as two eager engines ("fp32" and "fp8", different seeds) over the first N images of
VARIANTS (`tools/lab/make_variants.py`), streamed through `study/heldout.py: run_heldout` exactly
as a study streams them (decode workers, uint8 chunks, per-image rows), at a 64x64 input so
the pass is short on a small CPU. Peak resident memory comes from `os.wait4` (the process and
its decode workers). What grows with the number of images is what the pass keeps per image;
the full study at scale is `tools/lab/bench/scale.py` (it builds all engines; hours on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

INPUT = 64  # pixels: the pass's cost, not its memory per image, depends on it


def child(folder: str, size: int) -> None:
    """In the measured process: the streamed pass over the first `size` images."""
    import timm
    import torch

    from quantstudy.data.folders import scan_folder
    from quantstudy.data.stream import Uint8Transform
    from quantstudy.engines.builders import build_fp32
    from quantstudy.model.preprocess import EvalTransform, resolve_preprocessing
    from quantstudy.study.heldout import EnginePass, run_heldout

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    engines = {}
    for name, seed in (("fp32", 0), ("fp8", 1)):
        torch.manual_seed(seed)
        engines[name] = build_fp32(timm.create_model("test_efficientnet").eval(), cpu)
        engines[name].name = name
    pre = resolve_preprocessing(engines["fp32"].module)
    pre = pre.model_copy(update={"input_size": (3, INPUT, INPUT)})
    items = scan_folder(Path(folder)).items[:size]
    start = time.perf_counter()
    result = run_heldout(
        [EnginePass(n, e) for n, e in engines.items()], [("fp32", "fp8")], items,
        Uint8Transform(EvalTransform(pre).steps), eval_batch=64, device=cpu, cache=None,
    )  # fmt: skip
    wall = time.perf_counter() - start
    print(json.dumps({"images": result.n_images, "pass_s": round(wall, 2)}))


def measure(folder: Path, size: int) -> dict:
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    code += f"import stream_memory; stream_memory.child({str(folder)!r}, {size})"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return {
        "size": size,
        "rc": os.waitstatus_to_exitcode(status),
        "process_wall_s": round(time.perf_counter() - start, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        **result,
        "images_per_s": round(result["images"] / result["pass_s"], 1) if result else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="held-out images (tools/lab/make_variants.py)")
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--out", type=Path, required=True, help="JSON to write")
    a = p.parse_args()
    import torch

    from quantstudy.bench.provenance import collect_provenance

    results = [measure(a.folder, int(s)) for s in a.sizes.split(",")]
    for r in results:
        print(f"{r['size']:>6} images: peak {r['peak_rss_mib']} MiB, pass {r.get('pass_s')} s")
    peaks = [r["peak_rss_mib"] for r in results]
    doc = {
        "kind": "stream-memory",
        "what": __doc__.split("\n\n", 2)[2].strip(),
        "provenance": collect_provenance(torch.device("cpu"), sys.argv).model_dump(),
        "input": INPUT,
        "results": results,
        "peak_rss_spread_mib": round(max(peaks) - min(peaks), 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
