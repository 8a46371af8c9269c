"""Bytes, FLOPs and roofline time of every FP8-selected layer: a prediction before measuring.

The issue "Make FP8 pay" asks to count bytes and operations per layer before writing fused
kernels, so that each engine change has a written-down expected saving to test on the GPU. This
script resolves each model's default recipe on CPU (random weights: shapes are all that matter),
turns every selected layer into a matrix product M x K x N, and prices three ways of running it:

- fp16: the fp16 engine's one kernel (read activation and weight, write fp16 output);
- FP8 now, unfused: `FP8Matmul` read literally, three kernels: quantize (read fp16, write FP8),
  the `torch._scaled_mm` GEMM (read FP8 operands, write bf16), and the cast/bias pass (read and
  write the output once more). Layers with no FP8 kernel (kxk convs, run as quantize-dequantize
  around the fp16 conv) cost a fake-quant pass plus the fp16 conv;
- FP8 now, as Inductor fuses it: Inductor's output code (checked on CPU, see FP8_NOTES.md) folds
  the quantize into the producing pointwise kernel and the cast/bias into the consuming one, both
  of which the fp16 engine runs anyway; what is left is the GEMM plus one small kernel that
  materialises the row-wise activation scale (`expand(M, 1).contiguous()`, M float32 values);
- FP8 ideal: the producer already wrote FP8 and the GEMM's epilogue applies scales, bias,
  activation and residual: one kernel reading FP8 operands and writing the fp16 output.

Each kernel costs max(bytes / bandwidth, FLOPs / peak, latency floor): a roofline, a lower bound
on what a real kernel takes. Sums per model and batch are set against the measured H200 whole-engine
times in `benchmarks/results/*.json` to predict the best end-to-end speed-up if everything outside
the selected layers stays as measured.

    .venv/bin/python benchmarks/fp8_bytes.py benchmarks/results/fp8_bytes.json \
        --notes benchmarks/FP8_NOTES.md
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from torch import nn

from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.modules import real_fp8_blocker
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve

HERE = Path(__file__).resolve().parent
MODELS = (
    "mobilenetv4_conv_large.e500_r256_in1k",  # the tag the benchmark ran: 256 px input
    "ghostnet_100",
    "xception41",
    "crossvit_9_240",
    "res2net50_26w_4s",
    "tf_efficientnet_lite0",
)
BATCHES = (1, 128)

# H200 ceilings. Bandwidth and fp16 peak were measured on this kind of machine; FP8 = 2x fp16 and
# the per-kernel floor are assumptions (see FP8_NOTES.md).
BW = 4.3e12  # bytes/s, device-to-device copy
PEAK16 = 790e12  # FLOP/s, dense fp16/bf16 GEMM
PEAK8 = 2 * PEAK16  # FLOP/s, dense FP8 GEMM (assumed)
FLOOR = 2.5e-6  # s, launch/latency floor of one kernel inside a CUDA graph (assumed)
ALIGN = 16  # torch._scaled_mm needs K and N multiples of 16; FP8Matmul zero-pads to that


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def kernel_s(nbytes: float, flops: float = 0.0, peak: float = PEAK16) -> float:
    """Roofline time of one kernel: the slowest of memory, math and the launch floor."""
    return max(nbytes / BW, flops / peak, FLOOR)


@dataclass
class Layer:
    """One selected layer at one batch size, priced three ways (times in microseconds)."""

    name: str
    kind: str  # "gemm" (real FP8 today) or "kxk" (emulated today: no FP8 conv kernel)
    m: int
    k: int
    n: int
    act_in: int  # activation elements the layer reads (M*K for a 1x1 conv or linear)
    flops: float
    flops8: float  # FP8 GEMM FLOPs on the zero-padded K and N
    bytes16: float
    bytes8_now: float
    bytes8_ideal: float
    us16: float
    us8_quant: float  # today's separate quantize (or fake-quant) kernel
    us8_gemm: float  # today's GEMM (kxk: the fp16 conv that still runs)
    us8_epi: float  # today's cast/bias pass (kxk: none)
    us8_fill: float  # the row-wise scale_a kernel (per-channel weights only; kxk: none)
    us8_ideal: float
    bound16: str  # "memory" or "compute" under the fp16 roofline
    bound8: str  # the same for the ideal FP8 kernel

    @property
    def us8_now(self) -> float:
        """Unfused: every kernel of FP8Matmul's eager code runs on its own."""
        return self.us8_quant + self.us8_gemm + self.us8_epi + self.us8_fill

    @property
    def us8_fused(self) -> float:
        """As Inductor fuses it: quantize and cast/bias ride on pointwise kernels fp16 runs too."""
        return self.us8_gemm + self.us8_fill


def out_hw(conv: nn.Conv2d, h: int, w: int) -> tuple[int, int]:
    """Output map of a conv; string padding ('same', timm's Conv2dSame) keeps ceil(H / stride)."""
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    if isinstance(conv.padding, str) or type(conv).__name__ == "Conv2dSame":
        return math.ceil(h / sh), math.ceil(w / sw)
    ph, pw = conv.padding
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def price(
    name: str, module: nn.Module, hw: tuple[int, int], batch: int, per_channel: bool
) -> Layer:
    """M, K, N of one layer, and its bytes and roofline time in the three engines."""
    h, w = hw
    if isinstance(module, nn.Conv2d):
        ho, wo = out_hw(module, h, w)
        m = batch * ho * wo
        k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        n = module.out_channels
        # An implicit-GEMM kxk conv reads its input map once, not the M x K im2col matrix.
        act_in = m * k if module.kernel_size == (1, 1) else batch * h * w * module.in_channels
    else:
        m, k, n = batch * h * w, module.in_features, module.out_features
        act_in = m * k
    flops = 2.0 * m * k * n
    kind = "gemm" if real_fp8_blocker(module) is None else "kxk"
    kp, np_ = (_pad(k), _pad(n)) if kind == "gemm" else (k, n)
    bytes16 = 2 * act_in + 2 * n * k + 2 * m * n
    us16 = kernel_s(bytes16, flops) * 1e6
    if kind == "gemm":
        quant = 2 * act_in + act_in * kp / k  # read fp16, write padded FP8
        gemm = m * kp + np_ * kp + 2 * m * np_  # FP8 operands in, bf16 (or fp16) out
        epi = 2 * m * n + 2 * m * n  # cast bf16->fp16 and add bias: read and write the output
        us_q = kernel_s(quant) * 1e6
        us_g = kernel_s(gemm, 2.0 * m * kp * np_, PEAK8) * 1e6
        us_e = kernel_s(epi) * 1e6
        us_f = kernel_s(4 * m) * 1e6 if per_channel else 0.0  # scale_a: M float32 values
        now = quant + gemm + epi + (4 * m if per_channel else 0)
    else:  # quantize-dequantize pass in fp16, then the fp16 conv itself
        fq = 2 * act_in + 2 * act_in
        us_q, us_g, us_e, us_f = kernel_s(fq) * 1e6, us16, 0.0, 0.0
        now = fq + bytes16
    ideal = act_in * kp / k + np_ * kp + 2 * m * n  # FP8 in, epilogue fused, fp16 out
    us8 = kernel_s(ideal, 2.0 * m * kp * np_, PEAK8) * 1e6
    return Layer(
        name=name,
        kind=kind,
        m=m,
        k=k,
        n=n,
        act_in=act_in,
        flops=flops,
        flops8=2.0 * m * kp * np_,
        bytes16=bytes16,
        bytes8_now=now,
        bytes8_ideal=ideal,
        us16=us16,
        us8_quant=us_q,
        us8_gemm=us_g,
        us8_epi=us_e,
        us8_fill=us_f,
        us8_ideal=us8,
        bound16="compute" if flops / PEAK16 > bytes16 / BW else "memory",
        bound8="compute" if 2.0 * m * kp * np_ / PEAK8 > ideal / BW else "memory",
    )


def fp8_out_us(x: Layer) -> float:
    """The ideal kernel writing FP8 instead of fp16: the bound if every consumer read FP8."""
    return kernel_s(x.bytes8_ideal - x.m * x.n, x.flops8, PEAK8) * 1e6


def selected_layers(
    model_name: str,
) -> tuple[nn.Module, list[tuple[str, tuple[int, int]]], str, bool]:
    """The model (random weights), its recipe's selected layers with their input maps, the
    recipe's label, and whether its weight scales are per channel (row-wise _scaled_mm)."""
    model = timm.create_model(model_name, pretrained=False).eval()
    _, height, width = resolve_preprocessing(model).input_size
    recipe_name = default_recipe_for(model_name)
    recipe, _ = load_recipe(recipe_name)
    res = resolve(recipe, model, torch.randn(1, 3, height, width))
    chosen = [(d.name, d.input_hw) for d in res.selected if d.input_hw is not None]
    per_channel = recipe.weights.granularity == "per_channel"
    return model, chosen, f"{recipe_name} @ {height}x{width}", per_channel


def measured(model_name: str) -> dict[int, dict] | None:
    """Whole-engine ms and kernel groups of the unfused FP8 engine (`scaled_mm`, the engine
    these predictions price) from the latest benchmark JSON holding this model."""
    from render_results import engines_of, run_number

    arch = model_name.split(".", 1)[0]
    found = None
    for path in sorted((HERE / "results").glob("run*-bench-*.json"), key=run_number):
        for result in json.loads(path.read_text())["results"]:
            if result["model"].split(".", 1)[0] == arch:
                found = (path.name, dict(engines_of(result))["scaled_mm"])
    if found is None:
        return None
    source, r = found
    kernels = {(k["engine"], k["batch"]): k for k in r["speed"]["kernels"]}
    out = {}
    for b in r["speed"]["batches"]:
        groups = {
            e: {g["group"]: g["time_us"] for g in kernels[(e, b["batch"])]["groups"]}
            for e in ("fp16", "fp8")
            if (e, b["batch"]) in kernels
        }
        out[b["batch"]] = {
            "source": source,
            "fp8_real": r["fp8_real"],
            "fp8_emulated": r["fp8_emulated"],
            "fp16_ms": b["fp16_ms"]["median"],
            "fp8_ms": b["fp8_ms"]["median"],
            "x": b["ratio"]["median"],
            "groups_us": groups,
        }
    return out


def summarise(model_name: str, recipe: str, layers: list[Layer], meas: dict | None) -> dict:
    """Per model and batch: predicted sums, predicted x, and the measured figures beside them."""
    s16 = sum(x.us16 for x in layers)
    now = sum(x.us8_now for x in layers)
    fused = sum(x.us8_fused for x in layers)
    ideal = sum(x.us8_ideal for x in layers)
    gemm = [x for x in layers if x.kind == "gemm"]
    row = {
        "model": model_name.split(".", 1)[0],
        "recipe": recipe,
        "layers_gemm": len(gemm),
        "layers_kxk": len(layers) - len(gemm),
        "gflop": sum(x.flops for x in layers) / 1e9,
        "mb16": sum(x.bytes16 for x in layers) / 1e6,
        "mb8_now": sum(x.bytes8_now for x in layers) / 1e6,
        "mb8_ideal": sum(x.bytes8_ideal for x in layers) / 1e6,
        "us16": s16,
        "us8_now": now,
        "us8_fused": fused,
        "us8_ideal": ideal,
        "memory_bound16": sum(x.bound16 == "memory" for x in layers),
        "memory_bound8": sum(x.bound8 == "memory" for x in layers),
        "at_floor16": sum(x.us16 <= FLOOR * 1e6 for x in layers),
        # What each engine change removes, in the order the notes propose them.
        "save_fill_us": sum(x.us8_fill for x in gemm),
        "save_quant_us": sum(x.us8_quant for x in gemm),
        "save_epi_us": sum(x.us8_epi for x in gemm),
        "save_fp8_out_us": sum(x.us8_ideal - fp8_out_us(x) for x in gemm),
        "save_kxk_us": sum(x.us8_now - x.us8_ideal for x in layers if x.kind == "kxk"),
        "gemm8_gain_us": sum(x.us16 - x.us8_ideal for x in gemm),
        "pred_gemm8_us": sum(x.us8_gemm for x in gemm),
        "pred_gemm16_us": sum(x.us16 for x in gemm),
        "measured": meas,
    }
    if meas is not None:
        t16 = meas["fp16_ms"] * 1e3  # us
        rest = t16 - s16  # everything outside the selected layers, as measured
        row["x_pred_now"] = t16 / (rest + now)
        row["x_pred_fused"] = t16 / (rest + fused)
        row["x_pred_ideal"] = t16 / (rest + ideal)
    return row


def _f(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def prediction_table(rows: list[dict]) -> list[list[str]]:
    """The main table: one line per model and batch (times in us, sums over selected layers)."""
    head = [
        "model",
        "batch",
        "layers gemm/kxk",
        "GFLOP",
        "MB fp16 / FP8 unfused / FP8 ideal",
        "mem-bound fp16 / ideal",
        "fp16 us",
        "FP8 unfused us",
        "FP8 Inductor-fused us",
        "FP8 ideal us",
        "measured fp16 ms",
        "pred. x unfused",
        "pred. x Inductor-fused",
        "measured x",
        "pred. x ideal",
    ]
    out = [head]
    for r in rows:
        m = r["measured"]
        n = r["layers_gemm"] + r["layers_kxk"]
        out.append(
            [
                r["model"],
                str(r["batch"]),
                f"{r['layers_gemm']}/{r['layers_kxk']}",
                _f(r["gflop"], 2),
                f"{r['mb16']:.1f} / {r['mb8_now']:.1f} / {r['mb8_ideal']:.1f}",
                f"{r['memory_bound16']}/{n} / {r['memory_bound8']}/{n}",
                _f(r["us16"]),
                _f(r["us8_now"]),
                _f(r["us8_fused"]),
                _f(r["us8_ideal"]),
                _f(m["fp16_ms"], 3) if m else "-",
                _f(r.get("x_pred_now"), 2),
                _f(r.get("x_pred_fused"), 2),
                _f(m["x"], 2) if m else "-",
                _f(r.get("x_pred_ideal"), 2),
            ]
        )
    return out


def check_table(rows: list[dict]) -> list[list[str]]:
    """Predicted GEMM time of the layers that ran real FP8 against the measured kernel groups.

    The fp16 time of the replaced layers is measured as the fp16 engine's fp16_matmul_conv group
    minus the FP8 engine's (the convs left in fp16 are the same in both); the pointwise extra is
    the FP8 engine's quantize_convert + other minus the fp16 engine's.
    """
    head = [
        "model",
        "batch",
        "measured in (FP8 real/emulated there)",
        "pred. fp16 us",
        "measured fp16 us",
        "pred. FP8 GEMM us",
        "measured fp8_matmul us",
        "pred. scale_a kernels us",
        "measured pointwise extra us",
    ]
    out = [head]
    for r in rows:
        m = r["measured"]
        g16 = m["groups_us"].get("fp16", {}) if m else {}
        g8 = m["groups_us"].get("fp8", {}) if m else {}
        mm16 = pw = None
        if g16 and g8:
            mm16 = g16["fp16_matmul_conv"] - g8["fp16_matmul_conv"]
            pw = g8["quantize_convert"] + g8["other"] - g16["quantize_convert"] - g16["other"]
        out.append(
            [
                r["model"],
                str(r["batch"]),
                f"{m['source']} ({m['fp8_real']}/{m['fp8_emulated']})" if m else "-",
                _f(r["pred_gemm16_us"]),
                _f(mm16),
                _f(r["pred_gemm8_us"]),
                _f(g8.get("fp8_matmul")),
                _f(r["save_fill_us"]),
                _f(pw),
            ]
        )
    return out


def savings_table(rows: list[dict]) -> list[list[str]]:
    """What each proposed engine change removes (predicted us per engine call, roofline)."""
    head = [
        "model",
        "batch",
        "1. scale_a kernel",
        "2. FP8 GEMM at roofline vs fp16",
        "3. fuse epilogue",
        "4. FP8 output (bound)",
        "5. FP8 kxk conv",
        "(separate quantize kernel)",
    ]
    out = [head]
    for r in rows:
        out.append(
            [
                r["model"],
                str(r["batch"]),
                _f(r["save_fill_us"]),
                _f(r["gemm8_gain_us"]),
                _f(r["save_epi_us"]),
                _f(r["save_fp8_out_us"]),
                _f(r["save_kxk_us"]),
                _f(r["save_quant_us"]),
            ]
        )
    return out


def markdown(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in table[1:]])


def plain(table: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table)


def write_notes(path: Path, tables: str) -> None:
    """Replace the generated block of the notes, so no figure there is typed by hand."""
    begin, end = "<!-- fp8_bytes.py: begin -->", "<!-- fp8_bytes.py: end -->"
    text = path.read_text()
    head, rest = text.split(begin, 1)
    path.write_text(f"{head}{begin}\n{tables}\n{end}{rest.split(end, 1)[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json_out", type=Path, help="where to write the per-layer JSON")
    parser.add_argument("--notes", type=Path, help="Markdown file whose generated block to update")
    args = parser.parse_args()
    torch.set_num_threads(1)  # shared CPU; a batch-1 forward pass per model is all that runs
    torch.manual_seed(0)
    rows, per_layer = [], {}
    for model_name in MODELS:
        model, chosen, recipe, per_channel = selected_layers(model_name)
        meas = measured(model_name)
        for batch in BATCHES:
            layers = [price(n, model.get_submodule(n), hw, batch, per_channel) for n, hw in chosen]
            mb = meas.get(batch) if meas else None
            rows.append({"batch": batch, **summarise(model_name, recipe, layers, mb)})
            per_layer[f"{rows[-1]['model']}@{batch}"] = [
                {**asdict(x), "us8_now": x.us8_now, "us8_fused": x.us8_fused} for x in layers
            ]
    assumptions = {
        "bandwidth_bytes_per_s": BW,
        "peak_fp16_flop_per_s": PEAK16,
        "peak_fp8_flop_per_s": PEAK8,
        "kernel_floor_s": FLOOR,
        "kernel_time": "max(bytes / bandwidth, flops / peak, floor)",
        "align": ALIGN,
    }
    args.json_out.write_text(
        json.dumps({"assumptions": assumptions, "summary": rows, "layers": per_layer}, indent=1)
    )
    main_table = prediction_table(rows)
    print(plain(main_table))
    if args.notes:
        parts = [
            "Table 1: predictions (sums over the FP8-selected layers; us per engine call).",
            markdown(main_table),
            "Table 2: predicted vs measured kernel groups (measured figures from the JSON named).",
            markdown(check_table(rows)),
            "Table 3: predicted saving of each engine change (us per engine call, roofline).",
            markdown(savings_table(rows)),
        ]
        write_notes(args.notes, "\n\n".join(parts))


if __name__ == "__main__":
    main()
