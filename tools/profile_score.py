"""Time a study's "score" stage (`quality_section`, then `seal`) on synthetic per-image rows.

    PYTHONPATH=src python tools/profile_score.py 50000 [--threads 1] [--repeat 2] [--profile]

The rows are those `study/heldout.py` keeps for a study with its emulation floors: eight
engines (top-1, finite row, top-5 hit; a few NaN rows in one) and their pairs (KL, max logit
difference), with labels and image ids. It prints the fastest run's wall and CPU seconds and
the SHA-256 of the quality section and of the side file, so a change to the scoring can be
timed and checked to leave every number as it was; `--profile` adds cProfile's top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from quantstudy.quality.gap import gap_pairs
from quantstudy.quality.rows import PairRows, Predictions, RowSet
from quantstudy.record import QualitySection
from quantstudy.record.side import SideFile
from quantstudy.study.per_image import PerImageResults, quality_section, seal

STRESS = ["fp32", "fp16", "fp8", "fakequant", "fakequant_weights", "fakequant_activations"]
ENGINES = [*STRESS, "fakequant_reordered", "fakequant_half"]


def results(n: int, nan_rows: int, seed: int = 1) -> PerImageResults:
    """Rows of `n` images: fp32 right on 75%, each engine agreeing with it on 99%."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 1000, n).astype(np.int64)
    ref = np.where(rng.random(n) < 0.75, labels, rng.integers(0, 1000, n))
    engines = {}
    for name in ENGINES:
        top1 = ref if name == "fp32" else np.where(rng.random(n) < 0.99, ref, ref + 1)
        valid = np.ones(n, dtype=bool)
        if name == "fakequant_activations":
            valid[rng.integers(0, n, nan_rows)] = False
        top5 = valid & ((top1 == labels) | (rng.random(n) < 0.6))
        engines[name] = Predictions(top1=top1, valid=valid, top5=top5)
    pairs = [("fp32", e) for e in STRESS[1:]] + [("fp16", "fp8"), *gap_pairs(ENGINES)]
    rows = {}
    for p, q in pairs:
        finite = engines[p].valid & engines[q].valid
        kl = np.where(finite, rng.lognormal(-7, 2, n), np.nan)
        maxdiff = np.where(finite, rng.lognormal(-2, 1, n), np.nan)
        rows[(p, q)] = PairRows(finite=finite, kl=kl, maxdiff=maxdiff)
    ids = [f"n{i % 1000:08d}/ILSVRC2012_val_{i:08d}.JPEG" for i in range(n)]
    return PerImageResults(RowSet(engines, rows), ids, labels)


def score(res: PerImageResults, folder: Path) -> tuple[QualitySection, SideFile]:
    """The stage as `study/run.py` runs it (20 stress inputs of 1000 classes)."""
    names = [f"stress{i}" for i in range(20)]
    stress = {
        e: torch.randn(len(names), 1000, generator=torch.Generator().manual_seed(0)) for e in STRESS
    }
    return quality_section(res, stress, names, torch.float16, False, 0), seal(folder, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", type=int)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (scoring's workers)")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the fastest is shown")
    ap.add_argument("--nan-rows", type=int, default=3, help="NaN rows in one engine")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = results(a.images, a.nan_rows)
    best = (float("inf"), float("inf"))
    profile = cProfile.Profile() if a.profile else None
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            if profile:
                profile.enable()
            section, side = score(res, Path(folder))
            if profile:
                profile.disable()
            best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    print(f"{a.images} images: quality_section + seal {best[0]:.2f} s wall, {best[1]:.2f} s CPU")
    print("section sha256", hashlib.sha256(section.model_dump_json().encode()).hexdigest())
    print("side file sha256", side.sha256)
    if profile:
        pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
