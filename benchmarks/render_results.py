"""Render benchmarks/RESULTS.md from the benchmark JSON files and the seeds' TensorRT figures.

Every number in RESULTS.md comes from `benchmarks/results/*.json` (written by bench_speed.py on
the GPU) or from `benchmarks/seed_tensorrt.yaml` (figures published in the seed write-ups); none
is typed by hand.

    python benchmarks/render_results.py
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
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


def engines_of(r: dict) -> list[tuple[str, dict]]:
    """(FP8 kernel, figures) per FP8 engine of one result: runs 4+ time the fused and the
    unfused (`scaled_mm`) engine side by side; runs 1-3 timed `scaled_mm` only."""
    if "kernels" in r:
        return list(r["kernels"].items())
    return [("scaled_mm", r)]


def speed_table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "FP8 kernel",
        "recipe",
        "FP8 layers (real/emulated)",
        "absorbed acts / hand-offs",
        "batch",
        "fp16 ms [q1-q3]",
        "FP8 ms [q1-q3]",
        "x median [q1-q3]",
        "kernels fp16/FP8",
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for kernel, e in engines_of(r):
            lines += _speed_rows(r, kernel, e)
    return lines


def _speed_rows(r: dict, kernel: str, e: dict) -> list[str]:
    kern = {(k["engine"], k["batch"]): k for k in e["speed"]["kernels"]}
    lines = []
    for b in e["speed"]["batches"]:
        k16, k8 = kern.get(("fp16", b["batch"])), kern.get(("fp8", b["batch"]))
        cells = [
            r["model"],
            kernel,
            r["recipe"].removeprefix("builtin:"),
            f"{e['fp8_real']}/{e['fp8_emulated']}",
            f"{e.get('epilogue_activations', '-')}/{e.get('fp8_handoffs', '-')}",
            str(b["batch"]),
            _spread(b["fp16_ms"], 3),
            _spread(b["fp8_ms"], 3),
            _spread(b["ratio"], 2),
            f"{_count(k16)}/{_count(k8)}",
        ]
        lines.append(_row(cells))
    return lines


OWN_KERNEL = "_fp8_gemm_kernel"


def kernel_table(results: list[dict]) -> list[str]:
    head = ["model", "batch", "engine", "kernels", "total us", *GROUPS, f"of which {OWN_KERNEL}"]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for kernel, e in engines_of(r):
            for k in e["speed"]["kernels"]:
                if k["engine"] == "fp16" and kernel != engines_of(r)[0][0]:
                    continue  # the fp16 engine once per result
                engine = k["engine"] if k["engine"] == "fp16" else f"{k['engine']} ({kernel})"
                lines.append(_kernel_row(r, k, engine))
    return lines


def _kernel_row(r: dict, k: dict, engine: str) -> str:
    """One engine's groups, and the time of quantstudy's own FP8 kernel where the profile's top
    kernels list it (runs 4-10 filed the fused layer's input-quantize kernels, which Inductor
    names after `fp8_gemm`, under fp8_matmul; this column is the product alone)."""
    cells = [r["model"], str(k["batch"]), engine, str(k["kernel_count"])]
    own = dict(k.get("top_kernels", [])).get(OWN_KERNEL)
    return _row([*cells, f"{k['total_us']:.0f}", *_groups(k), "-" if own is None else f"{own:.0f}"])


# Issue 9's targets: batch-128 x per model (built-in recipe) and batch-1 x for all five.
TARGETS_128 = {
    "mobilenetv4_conv_large.e500_r256_in1k": 1.15,
    "ghostnet_100": 1.15,
    "xception41": 1.15,
    "res2net50_26w_4s": 1.15,
    "crossvit_9_240": 1.30,
}
TARGET_1 = 0.98


def target_table(runs: dict[str, dict], logged: list[LoggedRun] | None = None) -> list[str]:
    """Every fused run's x per target model and batch, latest first, against the targets;
    `logged` adds the runs known from their log, first."""
    measured: dict[str, list[tuple[str, dict]]] = {}
    for name, run in runs.items():  # in run order
        for r in run["results"]:
            for kernel, e in engines_of(r):
                if kernel == "fused":
                    measured.setdefault(r["model"], []).insert(0, (name, e))
    for log in logged or []:
        batches = [{"batch": b, "ratio": x} for b, x in log_fused_ratios(log.rows).items()]
        if batches:
            measured.setdefault(log.prov["model"], []).insert(
                0, (log.name, {"speed": {"batches": batches}})
            )
    head = ["model", "batch", "target x", "measured x median [q1-q3] (fused)", "met", "run"]
    lines = [_row(head), _row(["---"] * len(head))]
    for model, target in TARGETS_128.items():
        for batch, goal in ((1, TARGET_1), (128, target)):
            rows = [
                (name, b)
                for name, e in measured.get(model, [])
                for b in e["speed"]["batches"]
                if b["batch"] == batch
            ]
            if not rows:
                lines.append(_row([model, str(batch), f"{goal:.2f}", "not measured", "-", "-"]))
            for name, b in rows:
                met = "yes" if b["ratio"]["median"] >= goal else "no"
                lines.append(
                    _row([model, str(batch), f"{goal:.2f}", _spread(b["ratio"], 2), met, name])
                )
    return lines


def run_number(path: Path) -> int:
    """Runs sort by number (run10 after run9), not by name."""
    return int(re.match(r"run(\d+)", path.name)[1])


@dataclass(frozen=True)
class LoggedRun:
    """A run known only from its call's log (its JSON did not come back from the device): its
    `runs.yaml` entry, and, verbatim, bench_speed's printed table header, the model's rows of
    that table and its printed summary lines."""

    name: str
    prov: dict
    head: str | None
    rows: list[str]
    notes: list[str]

    @classmethod
    def read(cls, name: str, prov: dict) -> LoggedRun:
        model = prov["model"]
        text = (HERE / "results" / prov["log"]).read_text().splitlines()
        head = next((line for line in text if line.startswith("model | FP8 kernel | ")), None)
        rows = [line for line in text if line.startswith(f"{model} | ")]
        if rows and head is None:
            raise SystemExit(f"{prov['log']}: rows of {model} but no bench_speed table header")
        notes = [line for line in text if line.startswith(f"{model}: ")]
        return cls(name, prov, head, rows, notes)


def log_fused_ratios(rows: list[str]) -> dict[int, dict]:
    """batch -> x median, q1, q3 of the fused engine, parsed from `LoggedRun.rows`."""
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        if cells[1] == "fused":
            m = re.fullmatch(r"([\d.]+) \[([\d.]+)-([\d.]+)\]", cells[5])
            out[int(cells[2])] = dict(
                zip(("median", "q1", "q3"), map(float, m.groups()), strict=True)
            )
    return out


def agreement_lines(runs: dict[str, dict]) -> list[str]:
    out = []
    for name, run in runs.items():
        for r in run["results"]:
            a = r.get("fused_vs_unfused")
            if a:
                out.append(
                    f"- {r['model']} ({name}): fused vs unfused FP8 engine, top-1 agreement "
                    f"{a['agreement']:.4f} ({a['same_top1']} of {a['n_images']} images)"
                )
    return out


# Studies whose emulation floor (`quality.metrics.emulation_gap`: the fake-quant emulation
# against itself with only its fp32 summation order changed) bounds the fused/unfused agreement.
FLOOR_STUDIES = (
    "examples/tf_efficientnet_lite0-search-h200/candidate/study.json",
    "examples/tf_efficientnet_lite0-h200/study.json",
)


def floor_lines() -> list[str]:
    out = []
    for rel in FLOOR_STUDIES:
        path = HERE.parent / rel
        if not path.exists():
            continue
        study = json.loads(path.read_text())
        gap = study["quality"].get("emulation_gap") or {}
        if gap.get("floor_differ_count") is None:
            continue
        fp8 = next(e for e in study["engines"] if e["name"] == "fp8")
        n = study["quality"]["engines"][0]["n_images"]
        out.append(
            f"- `{rel}` ({study['config']['recipe']}, {len(fp8['fp8_real'])} FP8 layers, "
            f"{study['environment'].get('gpu_name') or study['config']['device']}): the emulation "
            f"against itself with fp32 sums reordered, top-1 agreement "
            f"{gap['floor_agreement']:.4f} ({gap['floor_differ_count']} of {n} images differ)"
        )
    return out


def autotune_lines(runs: dict[str, dict]) -> list[str]:
    """The fp16 engine under default mode against itself under max-autotune, where measured."""
    out = []
    for name, run in runs.items():
        for r in run["results"]:
            for b in (r.get("fp16_max_autotune") or {}).get("batches", []):
                out.append(
                    f"- {r['model']} ({name}), batch {b['batch']}: default "
                    f"{_spread(b['fp16_ms'], 3)} ms, max-autotune {_spread(b['fp8_ms'], 3)} ms, "
                    f"default / max-autotune {_spread(b['ratio'], 3)} (above 1: max-autotune "
                    "made fp16 faster)"
                )
    return out


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


def _flags(c: dict) -> str:
    """The optional flags a run was given (older runs' commands lack the newer keys)."""
    out = " --agreement" if c.get("agreement") else ""
    if c.get("fp16_autotune_batch") is not None:
        out += f" --fp16-autotune-batch {c['fp16_autotune_batch']}"
    return out + (" --fp16-autotune-only" if c.get("fp16_autotune_only") else "")


def run_section(name: str, run: dict, prov: dict) -> list[str]:
    c = run["command"]
    return [
        f"### {name}",
        "",
        f"- code: commit `{prov.get('commit', 'unknown')}`; engine: {prov.get('engine', '-')}",
        f"- device call: `{prov.get('call', '-')}`",
        f"- command: `python3 benchmarks/bench_speed.py --images {c['images']} --models "
        f"{c['models']} --batches {c['batches']} --rounds {c['rounds']} --iters {c['iters']} "
        f"--compile-mode {c['compile_mode']}{_flags(c)}`, started "
        f"{run['environment']['created_utc']}",
        "",
        *speed_table(run["results"]),
        "",
        "Kernel time per group (us per call, from one profiled non-graph call). In runs 4-10 the "
        "fused engine's fp8_matmul group also holds its input-quantize kernels (Inductor names "
        "them after the `fp8_gemm` op they feed; filed as quantize_convert since), so its "
        "quantize_convert reads 0; the last column is the fused product alone:",
        "",
        *kernel_table(run["results"]),
        "",
    ]


def log_section(log: LoggedRun) -> list[str]:
    name, prov, rows, notes = log.name, log.prov, log.rows, log.notes
    head = [c.strip() for c in log.head.split("|")] if log.head else []
    return [
        f"### {name}",
        "",
        f"- code: commit `{prov.get('commit', 'unknown')}`; engine: {prov.get('engine', '-')}",
        f"- device call: `{prov.get('call', '-')}`",
        f"- figures: copied from `results/{prov['log']}` (the JSON did not come back)",
        "",
        *(
            [_row(head), _row(["---"] * len(head)), *(f"| {r.strip()} |" for r in rows), ""]
            if rows
            else []
        ),
        *(f"- {n}" for n in notes),
        "",
    ]


def main() -> None:
    files = sorted((HERE / "results").glob("run*-bench-*.json"), key=run_number)
    runs = {p.name: json.loads(p.read_text()) for p in files}
    provenance = yaml.safe_load((HERE / "results" / "runs.yaml").read_text())
    logged = [LoggedRun.read(n, p) for n, p in provenance.items() if n.startswith("log-")]
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
        "running a real FP8 product (the FP8 kernel column) / layers quantize-dequantized around "
        "an fp16 op (kxk and "
        "depthwise convs, and in runs 1-2 also channel counts not multiples of 16).",
        "",
        "FP8 kernel: `scaled_mm` is the unfused layer (`quant/modules.py`: torch._scaled_mm "
        "writing bf16, then cast, bias and activation in Inductor's kernels; from run 15 it "
        "writes fp16 with the bias in cuBLASLt's epilogue, where the device supports that); "
        "`fused` is one Triton kernel per FP8 layer (`quant/triton_fp8.py`) with the per-channel "
        "scale, bias and the absorbed activation in its epilogue (`quant/fused.py`, "
        "`quant/absorb.py`); runs 4-15 let Triton keep each product's whole K loop in the "
        "Hopper tensor cores' reduced-precision FP8 accumulation (its sm90 default), run 16 "
        "moved the sums to float32 after every 32-product MMA, runs 17+ every 128 products as "
        "cuBLASLt does (`triton_fp8.PROMOTE`: bit-identical products). Runs 1-3 "
        "timed `scaled_mm` only; runs 4+ time both against the same fp16 engine. Absorbed acts / "
        "hand-offs: activations computed in the fused layers' epilogue, and FP8 layers that write "
        "the next FP8 layer's input (`quant/handoff.py`); '-' where the run predates the count "
        "(no hand-off existed before run 11).",
        "",
        "### Targets (issue 9): every fused run per model, latest first",
        "",
        *target_table(runs, logged),
        "",
        "Fused against unfused on real weights and all of val-1300 (the same quantization, "
        "computed differently: in runs 4-11 the unfused layer rounded its products to bf16, the "
        "fused one applied activations and FP8 hand-offs to float32 values the unfused engine "
        "rounds to fp16 first, and Triton left the FP8 sums in the tensor cores' reduced-"
        "precision accumulation; the first two changed in run 15's code (its Lite0 run was "
        "lost), the third in runs 16 (float32 after every MMA) and 17 (after every 128 products, "
        'as cuBLASLt); `benchmarks/FP8_NOTES.md`, "Fifth GPU session"):',
        "",
        *(agreement_lines(runs) or ["- not measured"]),
        "",
        "The floor under that agreement: two computations of the same FP8 recipe that differ "
        "only in fp32 summation order already disagree on about as many images, because FP8 "
        "rounding turns last-bit differences into whole FP8 steps (from the studies' own JSON; "
        "the studies calibrate on calib-1000 images, bench_speed on its first 128 images):",
        "",
        *(floor_lines() or ["- no study with the floor measured"]),
        "",
        "The fp16 engine under Inductor's max-autotune against default mode (issue 9 asks for one "
        "model at batch 128; `bench_speed.py --fp16-autotune-batch`):",
        "",
        *(
            autotune_lines(runs)
            + [
                f"- {note} ({log.name}, from its log)"
                for log in logged
                for note in log.notes
                if "max-autotune" in note
            ]
            or ["- not measured"]
        ),
        "",
        "Where a target is missed, the kernel-time breakdown of the run (its section below) and "
        "what it says would close the miss are in `benchmarks/FP8_NOTES.md`, sections "
        '"Fourth GPU session" (runs 11-15) and "Fifth GPU session" (runs 16-21).',
        "",
    ]
    for name, run in runs.items():
        out += run_section(name, run, provenance.get(name, {}))
    if logged:
        out += ["## Runs known from their log", ""]
        for log in logged:
            out += log_section(log)
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
