"""Is the FP8 engine worse than its emulation, or only different? From the H200 option rows that
kept per-image results: the images where exactly one of the FP8 engine and its fp32 emulation
differs from fp32, counted per row and in total, with a two-sided sign test on the totals (the
rows are closely related recipes on the same images, so the test is indicative, not exact).

Run from the repository root: `.venv/bin/python examples/lite0-fp8-options/engine_vs_emulation.py`.
"""

import json
from pathlib import Path

from scipy.stats import binomtest

HERE = Path(__file__).parent
FILES = ["options-h200-searches-paired.json", "options-h200-migration-paired.json"]

engine_only = emulation_only = 0
for name in FILES:
    for row in json.loads((HERE / name).read_text())["rows"]:
        fp8, emu = row.get("fp8") or {}, row["fakequant"]
        if "per_image" not in fp8 or "per_image" not in emu:
            continue
        e, q = set(fp8["per_image"]["differ"]), set(emu["per_image"]["differ"])
        engine_only += len(e - q)
        emulation_only += len(q - e)
        print(
            f"{name} | {row['variant']} | engine {len(e)}, emulation {len(q)} | "
            f"engine only {len(e - q)}, emulation only {len(q - e)}"
        )
p = binomtest(engine_only, engine_only + emulation_only).pvalue
print(f"total: engine only {engine_only}, emulation only {emulation_only}, sign test p = {p:.2f}")
