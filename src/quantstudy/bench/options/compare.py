"""`compare_options`: one recipe's layers under each FP8 quality-option variant, on one study's
preparation.

The model, images and labels come from `study.prepare.prepare_study`, the preparation every
study, search and benchmark measures from, so the table's rows are figures a study of the same
config would report: the same weights (BatchNorm re-estimated for random weights), the same
class-balanced, disjoint split, the same recipe resolution. Per variant the plan is built from
the calibration images with the recipe's options changed as the variant says (`variants.py`;
the prepared plan itself when nothing changes), the fp32 emulation (and for `engine_variants`
the FP8 engine) runs on the held-out images, and each is scored against fp32 (`scores.py`).
Every later variant is also paired with the first on the same images (`against_first`).

For engine variants the emulation's own floors are scored too: its sums reordered (`floor`,
and that run against fp32, `fakequant_reordered`) and its stored values rounded to each half
dtype (`floor_<dtype>`, `fakequant_<dtype>`), the most an engine storing in that dtype can
reach; with `engine_dtypes` the FP8 engine of the same plan is also built in those compute
dtypes (`fp8_<dtype>`), which tells the FP8 arithmetic from the half-precision storage between
layers. With `speed_batches` the FP8 engine is timed against fp16 with the study's harness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quantstudy.bench.options.scores import paired, row_line, score
from quantstudy.bench.options.variants import VARIANTS, variant_name
from quantstudy.bench.provenance import collect_provenance
from quantstudy.engines.base import Engine
from quantstudy.engines.builders import build_fakequant, build_fp8, build_half, half_dtype
from quantstudy.engines.run import run_engine, run_half_storage, run_reordered
from quantstudy.quant.calibration.choice import choose_calibrators
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.options import quant_options
from quantstudy.record import StudyConfig
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.record.quant_options import QuantOptions
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.study.prepare import Prepared, batches, prepare_study

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compare_options(
    config: StudyConfig,
    variants: list[str] | None = None,
    *,
    engine_variants: list[str] | None = None,
    speed_batches: list[int] | None = None,
    engine_dtypes: list[str] | None = None,
    storage_dtypes: list[str] | None = None,
    out: Path | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """The options table of `config`'s study (module docstring): one row per variant, in the
    order given (default: every variant). With `out`, the result so far is written there after
    each variant, so a long table cut short keeps its finished rows."""
    names = [variant_name(n) for n in variants] if variants else list(VARIANTS)
    engine_variants = [variant_name(n) for n in engine_variants or []]
    unknown = [n for n in [*names, *engine_variants] if n not in VARIANTS]
    if unknown:
        raise UserError(
            f"no option variant '{unknown[0]}'; the variants are: " + "; ".join(VARIANTS)
        )
    prepared = prepare_study(config)
    dev = prepared.device
    model, heldout = prepared.model, prepared.heldout_x
    labels = None if prepared.labels is None else prepared.labels.numpy()
    with torch.no_grad():
        m = model.to(dev)
        ref = torch.cat([m(b).float().cpu() for b in batches(heldout, config.eval_batch, dev)])
    model.cpu()
    result: dict[str, Any] = {
        "model": config.model,
        "weights": config.weights,
        "recipe": prepared.inputs.recipe_source,
        "layers": len(prepared.layers),
        "n_calib": int(prepared.calib_x.shape[0]),
        "n_heldout": int(heldout.shape[0]),
        "config": config.model_dump(mode="json", exclude_unset=True),
        "provenance": collect_provenance(dev, argv).model_dump(mode="json"),
        "rows": [],
    }
    fp16: list[Engine] = []  # built once, on the first timed variant
    for name in names:
        row = _row(prepared, name, ref, labels, name in (engine_variants or []), fp16,
                   [DTYPES[d] for d in engine_dtypes or []],
                   [DTYPES[d] for d in storage_dtypes or []], speed_batches or [])  # fmt: skip
        rows = result["rows"]
        if rows:  # against the first variant, on the same images
            row["against_first"] = {
                e: paired(rows[0][e], row[e])
                for e in (EngineName.FAKEQUANT, EngineName.FP8)
                if e in rows[0] and e in row
            }
        rows.append(row)
        print(row_line(row), flush=True)
        if out is not None:
            write_json_atomic(out, result)
    return result


def _row(
    prepared: Prepared,
    name: str,
    ref: torch.Tensor,
    labels: np.ndarray | None,
    engines: bool,
    fp16: list[Engine],
    extra: list[torch.dtype],
    storage: list[torch.dtype],
    speed_batches: list[int],
) -> dict[str, Any]:
    """One variant's row: its plan, the emulation's score and, for an engine variant, the
    floors and the FP8 engine (in each compute dtype asked, timed in its own)."""
    t0 = time.perf_counter()
    dev, model, x, example = prepared.device, prepared.model, prepared.heldout_x, prepared.example
    eval_batch = prepared.config.eval_batch
    options, plan = _plan(prepared, name)
    row: dict[str, Any] = {
        "variant": name,
        "options": asdict(options),
        "plan_seconds": time.perf_counter() - t0,
    }
    if plan.tuned is not None:
        row["tuning"] = {"heldout_kl": list(plan.tuned.heldout_kl), "epoch": plan.tuned.epoch}
    fq = build_fakequant(model, dev, example, plan)
    emulated = run_engine(fq, x, eval_batch).float().cpu()
    row[EngineName.FAKEQUANT] = score(ref, emulated, labels)
    if engines:
        floor = run_reordered(fq, x, eval_batch).float().cpu()
        row["floor"] = score(emulated, floor, labels)
        row["fakequant_reordered"] = score(ref, floor, labels)
        for dtype in storage or [half_dtype(dev)]:
            short = str(dtype).removeprefix("torch.")
            half = run_half_storage(fq, x, dtype, eval_batch).float().cpu()
            row[f"floor_{short}"] = score(emulated, half, labels)
            row[f"fakequant_{short}"] = score(ref, half, labels)
    del fq
    for dtype in [None, *extra] if engines else []:
        # None: the engine's own half dtype, the one a study times
        key = EngineName.FP8 if dtype is None else "fp8_" + str(dtype).removeprefix("torch.")
        fp8 = build_fp8(model, dev, example, plan, dtype=dtype, spec=BuildSpec.made())
        logits = run_engine(fp8.eagerly(), x, eval_batch).float().cpu()
        row[key] = score(ref, logits, labels)
        row[key + "_vs_fakequant"] = score(emulated, logits, labels)
        if dtype is None and speed_batches:
            if not fp16:
                fp16.append(build_half(model, dev, example))
            row["speed"] = _speed(fp16[0], fp8, x, speed_batches)
        del fp8
    row["seconds"] = time.perf_counter() - t0
    return row


def _plan(prepared: Prepared, name: str) -> tuple[QuantOptions, QuantPlan]:
    """The variant's options and plan: the prepared plan when the variant changes none of the
    recipe's options (no second calibration), else a plan calibrated for it."""
    dev, model, layers = prepared.device, prepared.model, prepared.layers
    base = quant_options(prepared.recipe)
    change = dict(VARIANTS[name])
    calib = _calibration_batches(prepared)
    if change.get("layer_calibrators") == "choose":
        change["layer_calibrators"] = choose_calibrators(
            model.to(dev), layers, calib, base.calibrator
        )
    options = replace(base, **change)
    if options == base:
        return options, prepared.plan
    plan = build_plan(model.to(dev), layers, calib, prepared.example, options)
    model.cpu()
    return options, plan


def _calibration_batches(prepared: Prepared) -> Callable[[], Iterator[torch.Tensor]]:
    x, size, dev = prepared.calib_x, prepared.config.eval_batch, prepared.device
    return lambda: batches(x, size, dev)


def _speed(
    fp16: Engine, fp8: Engine, images: torch.Tensor, sizes: list[int]
) -> list[dict[str, Any]]:
    """x = fp16 ms / FP8 ms per batch size, from the study's timing harness (no profile)."""
    from quantstudy.speed.harness import measure_speed

    section = measure_speed(
        {EngineName.FP16: fp16, EngineName.FP8: fp8}, images, sizes, rounds=20,
        compile_mode="default", kernel_profile=False,
    )[EngineName.FP8]  # fmt: skip
    return [b.model_dump(mode="json") for b in section.batches]
