"""Render benchmarks/RESULTS.md from the benchmark JSON files and the seeds' TensorRT figures.

Every number in RESULTS.md comes from `benchmarks/results/*.json` (written by bench_speed.py on
the GPU) or from `benchmarks/seed_tensorrt.yaml` (figures published in the seed write-ups); none
is typed by hand.

    python benchmarks/render_results.py
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
GROUPS = ("fp8_matmul", "fp16_matmul_conv", "depthwise_conv", "quantize_convert", "other")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _groups(k: dict | None) -> list[str]:
    if k is None:
        return ["-"] * len(GROUPS)
    by = {g["group"]: g["time_us"] for g in k["groups"]}
    return [f"{by.get(g, 0.0):.0f}" for g in GROUPS]


def _spread(t: dict, digits: int) -> str:
    return f"{t['median']:.{digits}f} [{t['q1']:.{digits}f}-{t['q3']:.{digits}f}]"


def _count(k: dict | None) -> str:
    return str(k["kernel_count"]) if k else "-"


def speed_table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "recipe",
        "FP8 layers (real/emulated)",
        "batch",
        "fp16 ms [q1-q3]",
        "FP8 ms [q1-q3]",
        "x median [q1-q3]",
        "kernels fp16/FP8",
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for b in r["speed"]["batches"]:
            kern = {(k["engine"], k["batch"]): k for k in r["speed"]["kernels"]}
            k16, k8 = kern.get(("fp16", b["batch"])), kern.get(("fp8", b["batch"]))
            lines.append(
                _row(
                    [
                        r["model"],
                        r["recipe"].removeprefix("builtin:"),
                        f"{r['fp8_real']}/{r['fp8_emulated']}",
                        str(b["batch"]),
                        _spread(b["fp16_ms"], 3),
                        _spread(b["fp8_ms"], 3),
                        _spread(b["ratio"], 2),
                        f"{_count(k16)}/{_count(k8)}",
                    ]
                )
            )
    return lines


def kernel_table(results: list[dict]) -> list[str]:
    head = ["model", "batch", "engine", "kernels", "total us", *GROUPS]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for k in r["speed"]["kernels"]:
            lines.append(
                _row(
                    [
                        r["model"],
                        str(k["batch"]),
                        k["engine"],
                        str(k["kernel_count"]),
                        f"{k['total_us']:.0f}",
                        *_groups(k),
                    ]
                )
            )
    return lines


def seed_table(seed: dict) -> list[str]:
    head = ["model", "GPU", "TensorRT", "opt level", "batch", "fp16 ms", "FP8 ms", "x", "source"]
    lines = [_row(head), _row(["---"] * len(head))]
    for f in seed["figures"]:
        ms = [("-" if f.get(k) is None else f"{f[k]:.3f}") for k in ("fp16_ms", "fp8_ms")]
        lines.append(
            _row(
                [
                    f["model"],
                    f["gpu"],
                    str(f["tensorrt"]),
                    "not stated" if f.get("opt_level") is None else str(f["opt_level"]),
                    str(f["batch"]),
                    *ms,
                    f"{f['x']:.2f}",
                    f["source"],
                ]
            )
        )
    return lines


def run_section(name: str, run: dict, prov: dict) -> list[str]:
    c = run["command"]
    return [
        f"### {name}",
        "",
        f"- code: commit `{prov.get('commit', 'unknown')}`; engine: {prov.get('engine', '-')}",
        f"- device call: `{prov.get('call', '-')}`",
        f"- command: `python3 benchmarks/bench_speed.py --images {c['images']} --models "
        f"{c['models']} --batches {c['batches']} --rounds {c['rounds']} --iters {c['iters']} "
        f"--compile-mode {c['compile_mode']}`, started {run['environment']['created_utc']}",
        "",
        *speed_table(run["results"]),
        "",
        "Kernel time per group (us per call, from one profiled non-graph call):",
        "",
        *kernel_table(run["results"]),
        "",
    ]


def main() -> None:
    files = sorted((HERE / "results").glob("run*-bench-*.json"))
    runs = {p.name: json.loads(p.read_text()) for p in files}
    provenance = yaml.safe_load((HERE / "results" / "runs.yaml").read_text())
    env = next(iter(runs.values()))["environment"]
    out = [
        "# Speed results",
        "",
        "Rendered by `python benchmarks/render_results.py` from the JSON in `benchmarks/results/`"
        " (written on the GPU by `benchmarks/bench_speed.py`; provenance in `runs.yaml`) and "
        "`benchmarks/seed_tensorrt.yaml`. Nothing here is typed by hand.",
        "",
        "## quantstudy on an NVIDIA H200: fp16 engine vs FP8 engine, torch.compile default mode",
        "",
        f"GPU {env['gpu_name']} (compute capability {env['gpu_capability']}), driver "
        f"{env['gpu_driver']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, torch {env['torch']}, "
        f"timm {env['timm']}, Python {env['python']}; {env['cpu_count']} CPU cores.",
        "",
        "Timed region: CUDA-graph replay of one engine call on a device-resident, pre-cast input "
        "of real images; fp16 and FP8 rounds interleaved; x = fp16 ms / FP8 ms per round pair "
        "(see `src/quantstudy/speed/harness.py`). Seed families use random weights (speed only); "
        "EfficientNet-Lite0 uses its real ImageNet weights. FP8 layers (real/emulated): layers "
        "running torch._scaled_mm / layers quantize-dequantized around an fp16 op (kxk and "
        "depthwise convs, and in runs 1-2 also channel counts not multiples of 16).",
        "",
    ]
    for name, run in runs.items():
        out += run_section(name, run, provenance.get(name, {}))
    seed_path = HERE / "seed_tensorrt.yaml"
    if seed_path.exists():
        seed = yaml.safe_load(seed_path.read_text())
        out += [
            "## For comparison: the seed studies' published TensorRT figures (another engine, "
            "other GPUs)",
            "",
            "Measured by the seed studies' authors with TensorRT on B200/B300 GPUs, copied from "
            "their write-ups (`../shared/seeds/`); not re-measured here and not comparable in "
            "absolute ms with the H200 rows above.",
            "",
            *seed_table(seed),
            "",
        ]
    (HERE / "RESULTS.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
