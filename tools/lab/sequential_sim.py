"""Simulate the sequential decision under every built-in policy; print a table and write JSON.

    PYTHONPATH=src python tools/lab/sequential_sim.py [--out FILE.json] [--studies N]

For each preset and each interval gate, 10,000 simulated studies per truth (below, on and above
the threshold; `decision/simulate.py: cases`) look after every round of 500 images up to
50,000 (the ImageNet validation set). The JSON holds, per case, the share of studies that
settled on pass / fail / neither, the wrong-verdict rate with its Monte Carlo standard error
and the guarantee it is held to, and the mean and median images at stop, with the provenance
(commit, command, versions) that produced it. No model and no image are involved: these are
properties of the procedure, not measurements of an engine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from quantstudy.decision import sequential as seq
from quantstudy.decision.policy import PRESETS, load_policy
from quantstudy.decision.simulate import TOP1_DISCORDANT, cases, simulate

STUDIES = 10_000
MAX_IMAGES = 50_000
ROUND = 500
SEED = 0


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = ["git", "status", "--porcelain", "src"]
        dirty = subprocess.run(status, capture_output=True, text=True)
        return out + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/results/sequential/sequential-sim.json"))
    ap.add_argument("--studies", type=int, default=STUDIES)
    args = ap.parse_args()
    rows = []
    header = f"{'policy':14} {'gate':16} {'truth':>7} {'thresh':>7} {'pass':>6} {'fail':>6} "
    header += f"{'open':>6} {'wrong':>7} {'bound':>6} {'mean stop':>9} {'median':>7}"
    print(header)
    for name in PRESETS:
        policy, _ = load_policy(name)
        for case in cases(policy):
            r = simulate(case, policy, args.studies, MAX_IMAGES, ROUND, SEED)
            rows.append(
                {
                    "policy": name,
                    "confidence": policy.confidence,
                    "gate": case.gate,
                    "truth_position": case.label,
                    "values": list(case.values),
                    "probs": list(case.probs),
                    "truth": case.truth,
                    "threshold": r.threshold,
                    "passed": r.passed,
                    "failed": r.failed,
                    "open": r.open,
                    "wrong": r.wrong,
                    "wrong_se": r.wrong_se,
                    "wrong_bound": r.wrong_bound,
                    "mean_stop": r.mean_stop,
                    "median_stop": r.median_stop,
                }
            )
            print(
                f"{name:14} {case.gate:16} {case.truth:7.4f} {r.threshold:7.4f} {r.passed:6.3f} "
                f"{r.failed:6.3f} {r.open:6.3f} {r.wrong:7.4f} {r.wrong_bound:6.3f} "
                f"{r.mean_stop:9.0f} {r.median_stop:7.0f}"
            )
    doc = {
        "kind": "sequential-simulation",
        "method": seq.METHOD,
        "source": seq.SOURCE,
        "bet_block": seq.BET_BLOCK,
        "truncation": seq.TRUNCATION,
        "kl_cap": seq.KL_CAP,
        "studies_per_case": args.studies,
        "max_images": MAX_IMAGES,
        "round_size": ROUND,
        "seed": SEED,
        "top1_discordant": TOP1_DISCORDANT,
        "provenance": {
            "command": "PYTHONPATH=src python " + " ".join(sys.argv),
            "commit": _commit(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        },
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
