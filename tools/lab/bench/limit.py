"""How close each FP8 engine comes to its limit: fused, scaled_mm and per-layer choice side by
side, with the ideal x at the FP8 roofline and measured x as a fraction of it.

    python tools/lab/bench/limit.py --images DIR --out limit.json \
        [--list FILE] [--models a,b] [--kernels fused,scaled_mm,fastest] [--batches 1,128] \
        [--agreement] [--recipe NAME] [--residual on|off|both] [--sum-handoff] [--pad-apart]

Per model of `--list` (a model list, default `seed-models.yaml` beside this script) or of `--models`
(a model not listed takes random weights): its entry's recipe or its family's built-in one (or
`--recipe`, a built-in name or YAML file, for every model named), prepared as a study prepares it
(`study.prepare.prepare_study`: the recipe's plan with every option it sets, calibrated on
`--n-images` images of `--images` and timed on as many others), the fp16 engine and one FP8 engine
per kernel, all compiled with Inductor (default mode), timed against fp16 with the study's harness
(`speed.harness.measure_speed`: CUDA-graph replay, interleaved rounds, kernel profile per batch),
and the ideal x from the same record (`speed.ideal`). `--agreement` adds, on the timed images, the
top-1 agreement of each FP8 engine (eager, so no extra compile) with the recipe's fp32 fake-quant
emulation, beside the emulation against itself run channels-last (its fp32 sums reordered): the
reassociation floor. Prints one table and writes JSON after every engine, so a run cut short keeps
what it finished. `--residual off` builds the fused engines with residual sums as separate passes
(`quant/rewrites/residual.py`), `both` times each fused engine both ways (the second as
"<kernel>/residual-apart"). `--sum-handoff` adds, for each fused engine with the sums, one whose
sums also write the next FP8 layer's input (`quant/rewrites/sum_handoff.py`), as
"<kernel>/sum-handoff". `--pad-apart` adds, for each fused engine with the sums, one whose 1x1 convs
do not write the next conv's zero padding (`quant/rewrites/pad_handoff.py`; the pad is then a pass
of its own), as "<kernel>/pad-apart".
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from quantstudy.engines.builders import build_fakequant, build_fp8, build_half, set_numerics
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.engines import KernelChoice
from quantstudy.record.inputs import StudyConfig
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import FASTEST, Engine, KernelGroup
from quantstudy.speed.harness import measure_speed
from quantstudy.speed.ideal import ideal_speed
from quantstudy.study.model_list import read_model_list
from quantstudy.study.prepare import Prepared, prepare_study

# the models timed by default, each with its weights: a model list (`study/model_list.py`)
SEEDS = Path(__file__).with_name("seed-models.yaml")
KERNELS = ("fused", FASTEST, "scaled_mm")
HEADER = (
    "model | kernel | FP8 real/emulated | scaled_mm layers | batch | fp16 ms | FP8 ms | "
    "x [q1-q3] | ideal x | of ideal | FP8 products us | top-1 vs emulation"
)


def environment(device: torch.device) -> dict[str, str]:
    import timm
    import triton

    return {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU)",
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": triton.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "commit": os.environ.get("QUANTSTUDY_GIT_COMMIT", "unknown"),
    }


def _top1_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(1) == b.argmax(1)).float().mean())


def prepare_model(name: str, args: argparse.Namespace) -> Prepared:
    """`name`'s study preparation (`study.prepare.prepare_study`, as a study prepares it): the
    recipe's plan with every option the recipe sets (rounding, bias correction, sequential fit,
    migration, headroom), calibrated on `--n-images` images and timed on `--n-images` others of
    `--images` (BatchNorm re-estimated first for random weights)."""
    entry = args.listed.get(name)  # a model not in the list: random weights, its family's recipe
    config = StudyConfig(
        model=name,
        weights=entry.weights if entry is not None and entry.weights else "random",
        data=args.images,
        recipe=args.recipe or (entry.recipe if entry is not None else None),
        calib=args.n_images,
        heldout=args.n_images,
        device=args.device.type,
        batches=tuple(args.batches),
        eval_batch=32,
    )
    return prepare_study(config)


def _plan_options(plan: QuantPlan) -> dict:
    """The options the timed plan was built with, read from the plan itself."""
    return {
        "per_channel": plan.per_channel,
        "bias_correction": plan.bias_correction,
        "rounding": str(plan.rounding),
        "scale_candidates": plan.scale_candidates,
        "refine_sweeps": plan.refine_sweeps,
        "row_scales": plan.row_scales,
        "migrated_layers": len(plan.divisors),
        "sequential": plan.fitted is not None,
    }


def bench_model(name: str, args: argparse.Namespace, save) -> dict:
    prepared = prepare_model(name, args)
    x, plan, device = prepared.heldout_x, prepared.plan, prepared.device
    model, fold = prepared.model, prepared.recipe.weights.fold_bn
    info, source = prepared.inputs.recipe_info, prepared.inputs.recipe_source
    weights, layers = prepared.config.weights, prepared.layers
    t0 = time.perf_counter()
    fp16 = build_half(model, device, x[:1], fold=fold)
    out: dict = {"model": name, "weights": weights, "recipe": source, "selected": len(layers)}
    out["plan"] = _plan_options(plan)
    out["kernels"] = {}
    reference = None
    chunk = max(args.batches)  # the timed batch: the FP8 kernels are autotuned for it already
    if args.agreement:
        emu = build_fakequant(model, device, x[:1], plan, fold=fold)
        with torch.no_grad():
            reference = torch.cat([emu(x[i : i + chunk]) for i in range(0, len(x), chunk)])
            xcl = x.contiguous(memory_format=torch.channels_last)
            reordered = torch.cat([emu(xcl[i : i + chunk]) for i in range(0, len(x), chunk)])
        out["emulation_floor"] = _top1_agreement(reference, reordered)
        del emu
    variants = {"on": ["sums"], "off": ["apart"], "both": ["sums", "apart"]}[args.residual]
    if args.sum_handoff and "sums" in variants:
        variants.insert(variants.index("sums") + 1, "handoff")
    if args.pad_apart and "sums" in variants:
        variants.insert(variants.index("sums") + 1, "padapart")
    for kernel, variant in ((k, v) for k in args.kernels for v in variants):
        if variant != "sums" and kernel == "scaled_mm":
            continue  # the unfused engine never sums in its epilogue
        chosen = KernelChoice.timed(args.batches) if kernel == FASTEST else kernel
        spec = BuildSpec.made(
            chosen, residual=variant != "apart", sum_handoff=variant == "handoff",
            pad_outputs=variant != "padapart",
        )  # fmt: skip
        fp8 = build_fp8(model, device, x[:1], plan, fold=fold, spec=spec)
        suffix = {"sums": "", "apart": "/residual-apart", "handoff": "/sum-handoff",
                  "padapart": "/pad-apart"}[variant]  # fmt: skip
        label = kernel if args.residual == "off" and variant == "apart" else kernel + suffix
        print(f"  {time.perf_counter() - t0:6.1f} s  {name}: timing fp16 vs {label}", flush=True)
        speed = measure_speed(
            {"fp16": fp16, "fp8": fp8}, x, args.batches, rounds=args.rounds, iters=args.iters,
            compile_mode="default",
        )["fp8"]  # fmt: skip
        einfo = fp8.info()
        gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
        ideal, why = ideal_speed(speed, info, [einfo], gpu)
        row = {
            "fp8_real": len(einfo.fp8_real),
            "fp8_emulated": len(einfo.fp8_emulated),
            "epilogue_activations": len(einfo.layout.epilogue),
            "fp8_handoffs": len(einfo.layout.handoff),
            "fp8_residual_sums": len(einfo.layout.residual),
            "fp8_sum_handoffs": len(einfo.layout.sum_handoff),
            "fp8_padded_outputs": len(einfo.layout.padded_output),
            "speed": speed.model_dump(mode="json"),
            "ideal": [i.model_dump(mode="json") for i in ideal or []],
            "ideal_not_computed": why,
            "kernel_choice": [c.model_dump(mode="json") for c in einfo.layout.kernel_choice or []],
        }
        if reference is not None:
            with torch.no_grad():
                got = torch.cat([fp8.eager(fp8.prepare(x[i : i + chunk])).float().cpu()
                                 for i in range(0, len(x), chunk)])  # fmt: skip
            row["agreement_with_emulation"] = _top1_agreement(got, reference)
        out["kernels"][label] = row
        print_rows(name, label, row)
        save(out)
        del fp8
        torch.cuda.empty_cache()
    out["seconds"] = time.perf_counter() - t0
    save(out)
    return out


def print_rows(name: str, kernel: str, row: dict) -> None:
    ideal = {i["batch"]: i for i in row["ideal"]}
    groups = {(k["engine"], k["batch"]): k for k in row["speed"]["kernels"]}
    chosen = sum(c["kernel"] == "scaled_mm" for c in row["kernel_choice"])
    for b in row["speed"]["batches"]:
        i = ideal.get(b["batch"])
        fp8mm = next(
            (g["time_us"] for g in groups.get((Engine.FP8, b["batch"]), {}).get("groups", [])
             if g["group"] == KernelGroup.FP8_MATMUL), float("nan"),
        )  # fmt: skip
        print(
            f"{name} | {kernel} | {row['fp8_real']}/{row['fp8_emulated']} | "
            f"{chosen if kernel == FASTEST else '-'} | {b['batch']} | "
            f"{b['fp16_ms']['median']:.3f} | {b['fp8_ms']['median']:.3f} | "
            f"{b['ratio']['median']:.2f} [{b['ratio']['q1']:.2f}-{b['ratio']['q3']:.2f}] | "
            f"{i['ideal_x'] if i else float('nan'):.2f} | "
            f"{100 * i['fraction'] if i else float('nan'):.0f}% | {fp8mm:.0f} | "
            f"{row.get('agreement_with_emulation', float('nan')):.4f}",
            flush=True,
        )


def ideal_of_records(paths: list[Path]) -> str:
    """The ideal x of stored `quantstudy bench speed` records, from each run's own profiles:
    the recipe's layer shapes are resolved again here (CPU, random weights: only shapes
    matter), the engine's emulated layers are the selected ones the kernel could not run
    (kxk convs for scaled_mm and, before the kxk kernel, for fused) when the record counts
    any, and the activations `quant/rewrites/absorb.py` finds on the folded model are the
    bias/activation passes the ideal removes, whichever FP8 kernel the record timed."""
    import copy

    from quantstudy.bench.schema import SpeedBench, read_record
    from quantstudy.quant.plan.apply import real_layers
    from quantstudy.quant.rewrites.absorb import absorbable_activations
    from quantstudy.quant.rewrites.fold import fold_batchnorm
    from quantstudy.record import EngineInfo

    head = "| record | model | FP8 kernel | batch | x | ideal x | x / ideal |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        record = read_record(path)
        if not isinstance(record, SpeedBench):
            continue
        for res in record.results:
            loaded = load_model(res.model, "random")
            example = torch.zeros(1, *resolve_preprocessing(loaded.model).input_size)
            recipe, source = load_recipe(res.recipe.removeprefix("builtin:"))
            info = resolve(recipe, loaded.model, example).to_info(recipe, source)
            names = [d.name for d in info.selected]
            folded = copy.deepcopy(loaded.model).eval()
            if recipe.weights.fold_bn:
                fold_batchnorm(folded, example)
            pointwise = real_layers(folded, names, "scaled_mm")
            absorbed = absorbable_activations(folded, pointwise, example)
            for e in res.engines:
                if e.speed is None:
                    continue
                emulated = [n for n in names if n not in pointwise] if e.fp8_emulated else []
                epilogue = {k: act for k, (_, act) in absorbed.items()}
                engine = EngineInfo(
                    name=Engine.FP8, compute_dtype="float16", device="cuda", compiled=True,
                    fp8_real=[n for n in names if n not in emulated], fp8_emulated=emulated,
                    fp8_epilogue=epilogue,  # the fp16 engine's passes: the same for both
                    fp16_layers=0, weight_bytes=0, numerics={},
                )  # fmt: skip
                found, _ = ideal_speed(e.speed, info, [engine], record.provenance.gpu_name)
                for i in found or []:
                    lines.append(
                        f"| {path.stem} | {res.model} | {e.fp8_kernel} | {i.batch} | "
                        f"{i.measured_x:.2f} | {i.ideal_x:.2f} | {100 * i.fraction:.0f}% |"
                    )
    return "\n".join(lines)


def render(paths: list[Path]) -> str:
    """The Markdown table of result files: one row per model, FP8 kernel and batch."""
    import json

    head = (
        "| model | FP8 kernel | batch | FP8 layers real/emulated | layers on scaled_mm | "
        "fp16 ms | FP8 ms | x median [q1-q3] | ideal x | x / ideal | FP8 products us "
        "(fp16 engine's products us) | top-1 vs emulation (floor) |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for path in paths:
        for m in json.loads(path.read_text())["models"]:
            for kernel in sorted(m["kernels"], key=lambda k: (*KERNELS, k).index(k)):
                row = m["kernels"][kernel]
                ideal = {i["batch"]: i for i in row["ideal"]}
                prof = {(k["engine"], k["batch"]): k for k in row["speed"]["kernels"]}
                picked = sum(c["kernel"] == "scaled_mm" for c in row["kernel_choice"])
                for b in row["speed"]["batches"]:
                    i, r = ideal.get(b["batch"]), b["ratio"]

                    def group(engine: str, name: str, batch: int = b["batch"], prof=prof) -> float:
                        groups = prof.get((engine, batch), {}).get("groups", [])
                        return next((g["time_us"] for g in groups if g["group"] == name), 0)

                    agree = row.get("agreement_with_emulation")
                    cells = [
                        m["model"],
                        kernel,
                        str(b["batch"]),
                        f"{row['fp8_real']}/{row['fp8_emulated']}",
                        str(picked) if kernel.startswith(FASTEST) else "-",
                        f"{b['fp16_ms']['median']:.3f}",
                        f"{b['fp8_ms']['median']:.3f}",
                        f"{r['median']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}]",
                        f"{i['ideal_x']:.2f}" if i else "-",
                        f"{100 * i['fraction']:.0f}%" if i else "-",
                        f"{group(Engine.FP8, KernelGroup.FP8_MATMUL):.0f} "
                        f"({group(Engine.FP16, KernelGroup.FP16_MATMUL_CONV):.0f})",
                        f"{agree:.4f} ({m['emulation_floor']:.4f})" if agree is not None else "-",
                    ]
                    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="tools/lab/bench/limit.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--render", type=Path, nargs="+", help="print the Markdown table of results")
    p.add_argument(
        "--ideal-of", type=Path, nargs="+", help="the ideal x of `quantstudy bench speed` records"
    )
    p.add_argument("--images", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--list", type=Path, default=SEEDS, help="a model list (default: the seeds)")
    p.add_argument("--models", help="comma-separated timm names (default: every one listed)")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--batches", default="1,128")
    p.add_argument(
        "--n-images", type=int, default=128, help="calibration images, and as many timed ones"
    )
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--agreement", action="store_true")
    p.add_argument("--recipe", help="recipe for every model (default: each family's own)")
    p.add_argument(
        "--residual", choices=("on", "off", "both"), default="on",
        help="residual sums in the fused layers' epilogue (both: time each way)",
    )  # fmt: skip
    p.add_argument(
        "--sum-handoff", action="store_true",
        help="also time the fused engines whose sums write the next FP8 layer's input",
    )  # fmt: skip
    p.add_argument(
        "--pad-apart", action="store_true",
        help="also time the fused engines whose 1x1 convs leave the next conv's padding a pass",
    )  # fmt: skip
    p.add_argument("--device", default="cuda", help="cpu: checks the plumbing, times nothing")
    args = p.parse_args(argv)
    if args.render:
        print(render(args.render))
        return
    if args.ideal_of:
        print(ideal_of_records(args.ideal_of))
        return
    if args.images is None or args.out is None:
        p.error("--images and --out are required to run")
    if args.recipe:
        load_recipe(args.recipe)  # a bad name or file is refused before any model loads
    args.listed = {e.name: e for e in read_model_list(args.list, "limit list").entries}
    names = args.models.split(",") if args.models else list(args.listed)
    args.kernels = args.kernels.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("tools/lab/bench/limit.py needs a CUDA GPU (or --device cpu)")
    set_numerics()
    env = environment(args.device)
    result = {"environment": env, "command": " ".join(sys.argv), "models": []}
    print(HEADER, flush=True)
    for name in names:

        def save(partial: dict, name: str = name) -> None:
            done = [m for m in result["models"] if m["model"] != name]
            result["models"] = [*done, partial]
            write_json_atomic(args.out, result)

        bench_model(name, args, save)


if __name__ == "__main__":
    main()
