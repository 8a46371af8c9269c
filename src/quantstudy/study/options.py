"""Quality (and, on a GPU, speed) of one recipe's layers under each FP8 quality option.

The recipe's layer selection is kept; each variant changes only the quantization options
(weight rounding, bias correction, activation scales, calibrators, migration), so the table says
what each option buys. Per variant: the plan is built from the calibration images
(`quant/plan.py`), the fp32 emulation (and optionally the FP8 engine) runs on the held-out
images, and each is scored against the fp32 model: images whose top-1 differs, agreement,
KL mean, top-1 change with its paired-bootstrap 95% interval. Every later variant is also
compared with the first on the same images (`against_first`): the change in KL mean and in the
number of differing top-1s, each with its paired 95% interval, since two variants' counts of
about 30 move by several images between runs that differ in a scale's last bit and only the
pairing says whether a difference is more than that. With `speed`, the fused FP8 engine
is timed against the fp16 engine (`speed/harness.measure_speed`, CUDA graphs). With
`engine_dtypes` the FP8 engine of the same plan is also built in other compute dtypes
(`fp8_<dtype>` rows): the engine in float32 against the emulation separates what the FP8
arithmetic does from what the engine's half-precision storage between its layers does, and
the `floor_<dtype>` row (the emulation with its stored values rounded to a half dtype,
`engines.run.run_half_storage`, against the emulation) is the floor for that storage;
`fakequant_<dtype>` scores the same run against fp32, as `fakequant_reordered` scores the
floor's reordered run: how far equally correct computations of one recipe land from fp32.

    python -m quantstudy.study.options tf_efficientnet_lite0 --weights efficientnet-lite0 \\
        --data val-1300 --calib-data calib-1000 --calib 500 --out options.json

The Lite0 figures of the README come from this module (`tests/data/test_fp8_quality_options.py`
on the CPU; the H200 call recorded in `examples/lite0-fp8-options/`).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.engines.builders import (
    build_fakequant,
    build_fp8,
    build_half,
    half_dtype,
    set_numerics,
)
from quantstudy.engines.run import run_engine, run_half_storage, run_reordered
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quality.metrics import kl_per_image
from quantstudy.quality.paired import PAIRED_RESAMPLES, paired_bootstrap, paired_mean_change
from quantstudy.quant.calibration.calibrate import HEADROOM_TRIED
from quantstudy.quant.calibration.choice import choose_calibrators
from quantstudy.quant.fitting.rounding import SEARCHED
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.resolve import resolve
from quantstudy.record.io import write_json_atomic
from quantstudy.record.quant_options import QuantOptions

# name -> changes to the recipe's options; "calibrators" is resolved by `choose_calibrators`.
VARIANTS: dict[str, dict] = {
    "nearest": {"rounding": "nearest", "bias_correction": False},
    "nearest + bias correction": {"rounding": "nearest", "bias_correction": True},
    "compensating": {"rounding": "compensating", "bias_correction": False},
    "compensating + bias correction": {"rounding": "compensating", "bias_correction": True},
    "compensating + bc + per-row scales": {
        "rounding": "compensating",
        "bias_correction": True,
        "row_scales": True,
    },
    "nearest + bc + per-row scales": {
        "rounding": "nearest",
        "bias_correction": True,
        "row_scales": True,
    },
    "compensating + bc + per-row scales + smooth migration": {
        "rounding": "compensating",
        "bias_correction": True,
        "row_scales": True,
        "migration": "smooth",
    },
    "sequential nearest + bias correction": {
        "rounding": "nearest",
        "bias_correction": True,
        "sequential": True,
    },
    "sequential compensating + bias correction": {
        "rounding": "compensating",
        "bias_correction": True,
        "sequential": True,
    },
    "sequential nearest + bc + per-row scales": {
        "rounding": "nearest",
        "bias_correction": True,
        "row_scales": True,
        "sequential": True,
    },
    "sequential compensating + bc + per-row scales": {
        "rounding": "compensating",
        "bias_correction": True,
        "row_scales": True,
        "sequential": True,
    },
    "sequential compensating + bc + smooth migration": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "sequential": True,
    },
    "sequential compensating + bc + per-layer calibrators": {
        "rounding": "compensating",
        "bias_correction": True,
        "layer_calibrators": "choose",
        "sequential": True,
    },
    "sequential compensating + bc + mse calibrator": {
        "rounding": "compensating",
        "bias_correction": True,
        "calibrator": "mse",
        "sequential": True,
    },
    "sequential compensating + bc + percentile calibrator": {
        "rounding": "compensating",
        "bias_correction": True,
        "calibrator": "percentile",
        "params": {"percentile": 99.99},
        "sequential": True,
    },
    "sequential compensating + bc + smooth migration + mse calibrator": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "calibrator": "mse",
        "sequential": True,
    },
    "sequential compensating + bc + smooth migration + per-layer calibrators": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "layer_calibrators": "choose",
        "sequential": True,
    },
    "nearest + bc + tuned biases": {
        "rounding": "nearest",
        "bias_correction": True,
        "tune": "bias",
    },
    "nearest + bc + tuned scales and biases": {
        "rounding": "nearest",
        "bias_correction": True,
        "tune": "scale_bias",
    },
    "sequential compensating + bc + smooth migration + tuned biases": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "sequential": True,
        "tune": "bias",
    },
    "sequential compensating + bc + smooth migration + tuned biases, 30 epochs": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "sequential": True,
        "tune": "bias",
        "tune_epochs": 30,
    },
    "sequential compensating + bc + smooth migration + tuned scales and biases": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
        "sequential": True,
        "tune": "scale_bias",
    },
    "compensating + bc + per-layer calibrators": {
        "rounding": "compensating",
        "bias_correction": True,
        "layer_calibrators": "choose",
    },
    "compensating + bc + smooth migration": {
        "rounding": "compensating",
        "bias_correction": True,
        "migration": "smooth",
    },
}

# The sequential fit with migration, the base of the searches and per-row variants below;
# `generic_pointwise_sequential` itself is `f"{_NO_MIGRATION} + scale search + refinement +
# headroom 4"` (its recipe file says why migration is left out).
_BUILT_IN = "sequential compensating + bc + smooth migration"
# Compensating rounding's searches (quant/rounding.py), on their own and together.
_SEARCHES = {
    "scale search": {"scale_candidates": SEARCHED.scales},
    "refinement": {"refine_sweeps": SEARCHED.sweeps},
    "scale search + refinement": {
        "scale_candidates": SEARCHED.scales,
        "refine_sweeps": SEARCHED.sweeps,
    },
}
_NO_MIGRATION = "sequential compensating + bias correction"
for _base in ("compensating + bias correction", _BUILT_IN, _NO_MIGRATION):
    for _label, _change in _SEARCHES.items():
        VARIANTS[f"{_base} + {_label}"] = {**VARIANTS[_base], **_change}
# Headroom above the calibrated amax (recipe schema, `activations.headroom`), alone and with the
# rounding searches.
for _base in (
    "compensating + bias correction",
    "compensating + bc + smooth migration",
    _BUILT_IN,
    f"{_BUILT_IN} + scale search + refinement",
    f"{_NO_MIGRATION} + scale search + refinement",  # the built-in recipe less migration
):
    VARIANTS[f"{_base} + headroom 4"] = {**VARIANTS[_base], "headroom": HEADROOM_TRIED}
VARIANTS[f"{_BUILT_IN} + per-row scales"] = {**VARIANTS[_BUILT_IN], "row_scales": True}
# Per-row scales on narrow inputs only, where a row's own scale gains most
# (examples/lite0-fp8-options, "Per-row activation scales").
for _width in (48, 112, 320):
    VARIANTS[f"{_BUILT_IN} + per-row scales on inputs <= {_width} channels"] = {
        **VARIANTS[_BUILT_IN],
        "row_scales": True,
        "row_max_channels": _width,
    }


def _batches(x: torch.Tensor, size: int, device: torch.device) -> Iterator[torch.Tensor]:
    return (x[i : i + size].to(device) for i in range(0, x.shape[0], size))


def score(ref: torch.Tensor, out: torch.Tensor, labels: np.ndarray) -> dict:
    """Against the fp32 logits `ref`: differing top-1s, agreement, KL mean, top-1 change (CI),
    and per image the KL and which top-1s differ (for `paired`)."""
    differs = (out.argmax(1) != ref.argmax(1)).numpy()
    differ = int(differs.sum())
    ref_ok = (ref.argmax(1).numpy() == labels).astype(np.int64)
    out_ok = (out.argmax(1).numpy() == labels).astype(np.int64)
    ci = paired_bootstrap(ref_ok, out_ok, resamples=2000, seed=0)
    kl = kl_per_image(ref, out)
    return {
        "differ": differ,
        "n": len(ref),
        "agreement": 1 - differ / len(ref),
        "kl_mean": float(np.mean(kl)),
        "top1_change": ci.change,
        "top1_low": ci.low,
        "top1_high": ci.high,
        "per_image": {
            "kl": [float(f"{v:.6g}") for v in np.asarray(kl, dtype=np.float64)],
            "differ": np.flatnonzero(differs).tolist(),
        },
    }


def paired(base: dict, other: dict) -> dict:
    """`other` against `base`, two scores of the same images: the change in KL mean and in
    the number of differing top-1s, each with its 95% paired bootstrap interval."""
    n = base["n"]
    flags = []
    for s in (base, other):
        f = np.zeros(n)
        f[s["per_image"]["differ"]] = 1.0
        flags.append(f)
    kl = paired_mean_change(
        np.asarray(base["per_image"]["kl"]), np.asarray(other["per_image"]["kl"]),
        resamples=PAIRED_RESAMPLES, seed=0,
    )  # fmt: skip
    count = paired_mean_change(*flags, resamples=PAIRED_RESAMPLES, seed=0)
    return {
        "kl_mean_change": kl.change,
        "kl_low": kl.low,
        "kl_high": kl.high,
        "differ_change": other["differ"] - base["differ"],
        "differ_low": count.low * n,
        "differ_high": count.high * n,
    }


def compare_options(
    model_name: str,
    weights: str,
    data: Path,
    calib_data: Path,
    n_calib: int,
    recipe_name: str = "generic_pointwise",
    variants: list[str] | None = None,
    device: str = "cpu",
    engine_variants: list[str] | None = None,
    speed_batches: list[int] | None = None,
    eval_batch: int = 100,
    out: Path | None = None,
    max_heldout: int | None = None,
    engine_dtypes: list[str] | None = None,
    storage_dtypes: list[str] | None = None,
) -> dict:
    """The rows of the options table for `model_name` (see the module docstring): the fp32
    emulation of every variant; the FP8 engine (and its speed at `speed_batches`) of those in
    `engine_variants` (run eagerly for quality; compiled, as studies time it, for speed).
    With `out`, the result so far is written there after each variant; `max_heldout` keeps
    the first held-out images only; `engine_dtypes` ("float32", "bfloat16", "float16") adds
    the same variants' FP8 engine in those compute dtypes, scored eagerly, not timed;
    `storage_dtypes` are the half dtypes the engine variants' emulation is also run stored in
    (default: the device's engine dtype)."""
    extra = [_DTYPES[d] for d in engine_dtypes or []]
    storage = [_DTYPES[d] for d in storage_dtypes or []]
    set_numerics()
    dev = torch.device(device)
    model = load_model(model_name, weights).model.eval()
    tf = build_transform(resolve_preprocessing(model))
    items = scan_folder(data).items[:max_heldout]
    heldout, labels = load_images(items, tf, desc="held-out images")
    calib, _ = load_images(scan_folder(calib_data).items[:n_calib], tf, desc="calibration")
    recipe, source = load_recipe(recipe_name)
    layers = resolve(recipe, model, heldout[:1]).selected_names
    base = quant_options(recipe)
    example = heldout[:1]
    labels = np.asarray(labels)
    with torch.no_grad():
        m = model.to(dev)
        ref = torch.cat([m(b).float().cpu() for b in _batches(heldout, eval_batch, dev)])
    rows, fp16 = [], None
    for name in variants or list(VARIANTS):
        t0 = time.perf_counter()
        change = dict(VARIANTS[name])
        if change.get("layer_calibrators") == "choose":
            change["layer_calibrators"] = choose_calibrators(
                model.to(dev), layers, lambda: _batches(calib, 50, dev), base.calibrator
            )
        options: QuantOptions = replace(base, **change)
        plan = build_plan(model.to(dev), layers, lambda: _batches(calib, 50, dev), example, options)
        plan_seconds = time.perf_counter() - t0
        model.cpu()
        row = {"variant": name, "options": _options_json(options), "plan_seconds": plan_seconds}
        if plan.tuned is not None:
            before, after = plan.tuned.heldout_kl
            row["tuning"] = {"heldout_kl": [before, after], "epoch": plan.tuned.epoch}
        fq = build_fakequant(model, dev, example, plan)
        emulated = run_engine(fq, heldout, eval_batch).float().cpu()
        row["fakequant"] = score(ref, emulated, labels)
        if name in (engine_variants or []):
            floor = run_reordered(fq, heldout, eval_batch).float().cpu()
            row["floor"] = score(emulated, floor, labels)
            row["fakequant_reordered"] = score(ref, floor, labels)
            for dtype in storage or [half_dtype(dev)]:
                short = str(dtype).removeprefix("torch.")
                half = run_half_storage(fq, heldout, dtype, eval_batch).float().cpu()
                row[f"floor_{short}"] = score(emulated, half, labels)
                row[f"fakequant_{short}"] = score(ref, half, labels)
        del fq
        for dtype in [None, *extra] if name in (engine_variants or []) else []:
            # None: the engine's own half dtype, the one timed
            key = "fp8" if dtype is None else "fp8_" + str(dtype).removeprefix("torch.")
            fp8 = build_fp8(model, dev, example, plan, dtype=dtype)
            logits = run_engine(fp8.eagerly(), heldout, eval_batch).float().cpu()
            row[key] = score(ref, logits, labels)
            row[key + "_vs_fakequant"] = score(emulated, logits, labels)
            if dtype is None and speed_batches:
                fp16 = fp16 or build_half(model, dev, example)
                row["speed"] = _speed(fp16, fp8, heldout, speed_batches)
            del fp8
        row["seconds"] = time.perf_counter() - t0
        if rows:  # against the first variant, on the same images
            row["against_first"] = {
                e: paired(rows[0][e], row[e])
                for e in ("fakequant", "fp8")
                if e in rows[0] and e in row
            }
        rows.append(row)
        print(_line(row), flush=True)
        if out is not None:
            write_json_atomic(
                out, _result(model_name, weights, source, layers, calib, heldout, dev, rows)
            )
    return _result(model_name, weights, source, layers, calib, heldout, dev, rows)


def _result(model_name, weights, source, layers, calib, heldout, dev, rows) -> dict:
    return {
        "model": model_name,
        "weights": weights,
        "recipe": source,
        "layers": len(layers),
        "n_calib": len(calib),
        "n_heldout": len(heldout),
        "device": _device_text(dev),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "rows": rows,
    }


def _speed(fp16, fp8, images: torch.Tensor, batches: list[int]) -> list[dict]:
    """x = fp16 ms / FP8 ms per batch size, from the study's timing harness (no profile)."""
    from quantstudy.speed.harness import measure_speed

    section = measure_speed(
        fp16, fp8, images, batches, rounds=20, compile_mode="default", kernel_profile=False
    )
    return [b.model_dump(mode="json") for b in section.batches]


def _options_json(options: QuantOptions) -> dict:
    return asdict(options)


def _device_text(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _line(row: dict) -> str:
    parts = [row["variant"]]
    extra = [k for k in row if k.startswith("fp8_") and k != "fp8_vs_fakequant"]
    stored = [k for k in row if k.startswith(("floor_", "fakequant_"))]
    for engine in ("fakequant", "fp8", "fp8_vs_fakequant", *extra, "floor", *stored):
        if engine in row:
            r = row[engine]
            parts.append(
                f"{engine}: {r['differ']}/{r['n']} differ, agreement {r['agreement']:.4f}, "
                f"KL {r['kl_mean']:.4f}, top-1 {r['top1_change'] * 100:+.2f} "
                f"[{r['top1_low'] * 100:+.2f}, {r['top1_high'] * 100:+.2f}] pt"
            )
    for engine, c in row.get("against_first", {}).items():
        parts.append(
            f"{engine} - first: KL {c['kl_mean_change']:+.4f} [{c['kl_low']:+.4f}, "
            f"{c['kl_high']:+.4f}], differ {c['differ_change']:+d} [{c['differ_low']:+.0f}, "
            f"{c['differ_high']:+.0f}]"
        )
    if "tuning" in row:
        (before, after), epoch = row["tuning"]["heldout_kl"], row["tuning"]["epoch"]
        parts.append(f"tuning: held-out KL {before:.4f} -> {after:.4f} (epoch {epoch})")
    parts.append(f"plan {row['plan_seconds']:.1f} s")
    return " | ".join(parts)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--weights", default="efficientnet-lite0")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--calib-data", type=Path, required=True)
    p.add_argument("--calib", type=int, default=500)
    p.add_argument("--recipe", default="generic_pointwise")
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=None)
    p.add_argument("--engine-variants", nargs="*", choices=list(VARIANTS), default=[])
    p.add_argument("--speed-batches", type=int, nargs="*", default=[])
    p.add_argument(
        "--engine-dtypes", nargs="*", choices=list(_DTYPES), default=[],
        help="also score the engine variants' FP8 engine in these compute dtypes (not timed)",
    )  # fmt: skip
    p.add_argument(
        "--storage-dtypes", nargs="*", choices=["float16", "bfloat16"], default=[],
        help="run the engine variants' emulation stored in these dtypes (default: the engine's)",
    )  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument(
        "--max-heldout", type=_positive, default=None, help="the first N held-out images"
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    result = compare_options(
        a.model, a.weights, a.data, a.calib_data, a.calib, a.recipe, a.variants, a.device,
        a.engine_variants, a.speed_batches, out=a.out, max_heldout=a.max_heldout,
        engine_dtypes=a.engine_dtypes, storage_dtypes=a.storage_dtypes,
    )  # fmt: skip
    args = argv if argv is not None else sys.argv[1:]
    result["command"] = "python -m quantstudy.study.options " + " ".join(args)
    write_json_atomic(a.out, result)


if __name__ == "__main__":
    main()
