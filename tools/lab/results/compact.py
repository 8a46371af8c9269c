"""Compact result files: the figures of bulky result files (options tables with per-image KL,
limit records with per-round timings, whole study records) kept as small JSON with the path and
commit of the file they came from, so the bulky files can live in git history only.

    python tools/lab/results/compact.py --git COMMIT --out docs/results/figures

reads the source files named below from the working tree and writes one compact JSON per group.
The sources left the tree once compacted; to redo a group, restore them first (`git checkout
COMMIT -- PATHS`, COMMIT being the `git` field of the compact file). Each compact file says, per
source, its path, the commit, and the command, device and versions the source recorded; nothing
is recomputed, only dropped: per-image arrays, per-round samples, kernel name lists and
calibration tables.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

OPTIONS = "examples/lite0-fp8-options"
GROUPS: dict[str, tuple[str, str, list[str]]] = {
    "fp8-options-lite0": (
        "options",
        "EfficientNet-Lite0 (real weights, all 32 pointwise convs) under each FP8 quality option "
        "(`quantstudy bench options`, formerly `python -m quantstudy.study.options`)",
        [
            f"{OPTIONS}/{n}.json"
            for n in (
                "options-cpu-compensating",
                "options-cpu-sequential",
                "options-cpu-headroom",
                "options-cpu-no-migration",
                "options-cpu-searched",
                "options-cpu-searched-other500",
                "options-cpu-rows",
                "options-cpu-depthwise",
                "options-cpu-tuned-trial",
                "options-cpu-engine-float32",
                "options-cpu-evidence-2026-12-02",
                "options-h200-fakequant",
                "options-h200-sequential",
                "options-h200-sequential-2",
                "options-h200-sequential-3",
                "options-h200-sequential-migration-speed",
                "options-h200-migration-paired",
                "options-h200-searches",
                "options-h200-searches-paired",
                "options-h200-tuned",
                "options-h200-narrow-rows",
                "options-h200-prologue-all",
                "options-h200-prologue-narrow",
                "options-h200-prologue-divisions",
                "storage-floor/options-cpu-storage",
                "storage-floor/options-cpu-evidence-nchw",
                "storage-floor/options-h200-storage",
                "storage-floor/options-h200-storage-nchw",
            )
        ],
    ),
    "limit-per-layer-choice": (
        "limit",
        "fp16 against the fused, per-layer-choice and scaled_mm FP8 engines of the six models, "
        "with the ideal x (`tools/lab/bench/limit.py`), before residual sums in the epilogue",
        [
            "docs/results/limit/limit-lite0-mnv4-ghostnet-b1-b128.json",
            "docs/results/limit/limit-xception-crossvit-b1-b128.json",
            "docs/results/limit/limit-res2net50_26w_4s-b128.json",
        ],
    ),
    "limit-residual-sums": (
        "limit",
        "the same with residual sums in the fused kernel's epilogue, each beside the engine "
        "with the adds apart (`--residual both`)",
        [
            "docs/results/limit/limit-res2net-residual-b128.json",
            "docs/results/limit/limit-lite0-mnv4-ghostnet-residual-b1-b128.json",
            "docs/results/limit/limit-xception-crossvit-residual-b1-b128.json",
            "docs/results/limit/limit-res2net-b1.json",
        ],
    ),
    "limit-sum-handoff": (
        "limit",
        "residual sums that also write the next FP8 layer's input (`--sum-handoff`)",
        [
            "docs/results/limit/limit-res2net-sum-handoff-b128.json",
            "docs/results/limit/limit-res2net-sum-handoff-descriptor-b128.json",
            "docs/results/limit/limit-lite0-sum-handoff-b128.json",
        ],
    ),
    "limit-pad-handoff": (
        "limit",
        "fused 1x1 convs writing the zero padding of the strided convs that read them, against "
        "the pad as a pass of its own (`--pad-apart`)",
        [f"{OPTIONS}/padded/limit-h200-pad.json"],
    ),
    "epilogue-sum-handoff": (
        "raw",
        "res2net's block-ending products alone: residual sum, separate FP8 quantize, pair store",
        [
            "docs/results/limit/epilogue-res2net-b128.json",
            "docs/results/limit/epilogue-res2net-b128-descriptor-store.json",
        ],
    ),
    "studies-lite0": (
        "study",
        "EfficientNet-Lite0 studies and searches whose records left the examples",
        [
            f"{OPTIONS}/study-h200-padded/study.json",
            f"{OPTIONS}/study-h200-generic_pointwise_sequential/study.json",
            f"{OPTIONS}/study-h200-searched/study.json",
            f"{OPTIONS}/padded/study-h200-with-migration/study.json",
            f"{OPTIONS}/storage-floor/study-h200-float32-engine/study.json",
            "examples/tf_efficientnet_lite0-search-h200/candidate/study.json",
            "examples/tf_efficientnet_lite0-search-h200/searched/study.json",
            "examples/tf_efficientnet_lite0-search-bc-cpu/candidate/study.json",
            "examples/tf_efficientnet_lite0-search-bc-cpu/searched/study.json",
            "examples/tf_efficientnet_lite0-cpu-1300/study.json",
        ],
    ),
    "kernels-lite0-row-scales": (
        "kernels",
        "every kernel of Lite0's FP8 engine with per-row activation scales (`bench kernels`)",
        [f"{OPTIONS}/kernels-h200-rows.json", f"{OPTIONS}/kernels-h200-narrow-rows.json"],
    ),
    "study-time-lite0": (
        "study_time",
        "one Lite0 study's stage times from cold caches and warm (`tools/lab/bench/study_time.py`)",
        ["docs/results/study-time/lite0-h200-d46a9f6.json"],
    ),
}


def label(path: str) -> str:
    """A source's short name for the docs: its file name (its folder's for a study record), the
    date some names carried left out."""
    parts = path.split("/")
    stem = parts[-1].removesuffix(".json")
    if stem == "study":
        stem = parts[-2]
    elif parts[-2] in ("storage-floor", "padded"):
        stem = f"{parts[-2]}/{stem}"
    if parts[1].startswith("tf_efficientnet_lite0-") and parts[-1] == "study.json":
        stem = parts[1].removeprefix("tf_efficientnet_lite0-")
        stem += f"/{parts[-2]}" if len(parts) > 3 else ""
    return re.sub(r"-20\d\d-\d\d-\d\d", "", stem)


def _r(x: Any) -> Any:
    """Floats to 6 significant digits, recursively."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _r(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_r(v) for v in x]
    return x


def _stats(s: dict) -> dict:
    return {k: s[k] for k in ("median", "q1", "q3") if k in s}


def _speed_batches(batches: list[dict]) -> list[dict]:
    return [
        {"batch": b["batch"], "fp16_ms": _stats(b["fp16_ms"]), "fp8_ms": _stats(b["fp8_ms"]),
         "x": _stats(b["ratio"])}
        for b in batches
    ]  # fmt: skip


def _groups(kernels: list[dict]) -> list[dict]:
    """Kernel time per group per engine and batch, without the kernel name lists."""
    out = []
    for k in kernels:
        groups = {g["group"]: g["time_us"] for g in k.get("groups", [])}
        out.append(
            {
                "engine": k["engine"],
                "batch": k["batch"],
                "groups_us": groups,
                "total_us": k.get("total_us"),
                "kernel_count": k.get("kernel_count"),
            }
        )
    return out


def options(d: dict) -> dict:
    rows = []
    for row in d["rows"]:
        c: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, dict) and "per_image" in value:
                c[key] = {k: v for k, v in value.items() if k != "per_image"}
            elif key == "speed":
                c[key] = _speed_batches(value)
            else:
                c[key] = value
        rows.append(c)
    head = {k: d.get(k) for k in ("command", "device", "versions", "model", "weights", "recipe",
                                  "layers", "n_calib", "n_heldout")}  # fmt: skip
    return head | {"rows": rows}


def limit(d: dict) -> dict:
    models = []
    for m in d["models"]:
        kernels = {}
        for name, row in m["kernels"].items():
            c = {k: v for k, v in row.items() if k not in ("speed", "ideal", "kernel_choice")}
            c["speed"] = _speed_batches(row["speed"]["batches"])
            c["kernel_groups"] = _groups(row["speed"].get("kernels", []))
            c["ideal"] = [{k: i[k] for k in ("batch", "ideal_x", "measured_x", "fraction")}
                          for i in row["ideal"]]  # fmt: skip
            c["layers_on_scaled_mm"] = sum(
                ch["kernel"] == "scaled_mm" for ch in row.get("kernel_choice", [])
            )
            kernels[name] = c
        models.append({k: v for k, v in m.items() if k != "kernels"} | {"kernels": kernels})
    return {"command": d.get("command"), "environment": d.get("environment"), "models": models}


def study(d: dict) -> dict:
    speed = d.get("speed") or {}
    quality = d.get("quality") or {}
    engines = [
        {k: e.get(k) for k in ("engine", "agreement", "differ_count", "gained", "lost",
                               "ci_low", "ci_high", "kl_mean", "kl_median", "kl_p99")}
        for e in quality.get("engines", [])
    ]  # fmt: skip
    gates = [
        {k: g.get(k) for k in ("name", "metric", "baseline", "batch", "threshold", "value", "low",
                               "high", "status", "images_needed")}
        for g in (d.get("decision") or {}).get("gates", [])
    ]  # fmt: skip
    fp8 = next((e for e in d.get("engines", []) if e.get("name") == "fp8"), {})
    return {
        "study": d["name"],
        "config": d["config"],
        "environment": d["environment"],
        "recipe": {k: d["recipe"].get(k) for k in ("name", "source") if k in d["recipe"]}
        | {"selected": len(d["recipe"].get("selected", []))},
        "fp8_engine": {
            k: (len(v) if isinstance(v, list | dict) else v)
            for k, v in fp8.items()
            if k.startswith("fp8_") or k in ("compute_dtype", "compiled")
        },
        "decision": {"outcome": (d.get("decision") or {}).get("outcome"), "gates": gates},
        "speed": _speed_batches(speed.get("batches", [])),
        "ideal": speed.get("ideal"),
        "kernel_groups": _groups(speed.get("kernels") or []),
        "quality": {"engines": engines, "emulation_gap": quality.get("emulation_gap")},
        "search": d.get("search"),
    }


def kernels(d: dict) -> dict:
    keep = {k: v for k, v in d.items() if k not in ("sources", "engines")}
    engines = d.get("engines", [])
    keep["engines"] = [
        {k: v for k, v in e.items() if k not in ("kernels", "sources")} for e in engines
    ]
    return keep


def study_time(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "phases"}


KINDS = {"options": options, "limit": limit, "study": study, "kernels": kernels,
         "study_time": study_time, "raw": lambda d: d}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--git", required=True, help="the commit the source files are read at")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    for name, (kind, what, paths) in GROUPS.items():
        sources = []
        for path in paths:
            data = json.loads(Path(path).read_text())
            head = {"name": label(path), "file": path, "git": a.git}
            sources.append(head | _r(KINDS[kind](data)))
        out = a.out / f"{name}.json"
        out.write_text(json.dumps({"what": what, "sources": sources}, indent=1) + "\n")
        print(f"{out}: {out.stat().st_size} bytes from {len(paths)} files")


if __name__ == "__main__":
    main()
