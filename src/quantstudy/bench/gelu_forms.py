"""`quantstudy bench gelu`: what cuBLASLt's tanh GELU costs against timm's erf, on one model.

cuBLASLt's GELU epilogue computes the tanh approximation (docs/cublaslt.md); a cuBLASLt engine
records which layers ran it (`FP8Layout.gelu`) and its emulation computes the same form there.
This bench measures the difference on the emulation, the study's reference arithmetic, so it
runs on the CPU as well as on a GPU:

- which layers run tanh: those the cuBLASLt engine of the study's plan records (built, not run);
- the FP8 codes: over the held-out images, each such layer's pre-activation (in the erf
  emulation) through erf and through tanh GELU, both written as the e4m3 codes the next layer
  reads (its static input scale): the share of codes that differ and the largest distance in
  steps (`bench/lt_probe.py: steps`);
- the agreement: top-1 and KL against fp32 of the emulation with erf everywhere and with tanh
  on those layers, the two against each other, and the emulation's own floors on the same
  images (its fp32 sums reordered; its stored values rounded to fp16, the GPU engine's dtype;
  `engines/run.py`): the tanh emulation differs from the erf one "within the floor" where it
  moves no more top-1s than a floor run does.

It is the emulation, not the GPU engine; with random weights (`--weights random`) the figures
say how often the forms' difference flips a code and a top-1 of that network, not what a
trained network loses. One record holds a row per model: a run replaces its model's row.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantstudy.record import FP8Layout, StudyConfig
    from quantstudy.study.prepare import Prepared

KIND = "gelu-forms"
FLOOR_DTYPE = "float16"  # the GPU engine's storage between layers, the half floor's dtype


def run(args: argparse.Namespace, context: Any) -> None:
    """Measure `args.model` (`measure`, with the study config and command line of `context`,
    the bench's `Context`), put its row into the record `args.record` (the rows of other
    models kept) and print the record's table."""
    import torch

    from quantstudy.record.errors import UserError
    from quantstudy.record.io import write_json_atomic
    from quantstudy.record.readers import read_json

    if args.threads:
        torch.set_num_threads(args.threads)
    path: Path = args.record
    record = read_json(path, "GELU forms record") if path.exists() else {"kind": KIND, "rows": []}
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise UserError(f"--out {path}: not a GELU forms record; name a new file or one of those")
    row = measure(context.study_config(), context.argv)
    rows = [r for r in record["rows"] if r["model"] != row["model"]] + [row]
    record = {"kind": KIND, "what": __doc__.splitlines()[0], "rows": rows}
    write_json_atomic(path, record)
    print("\n".join(table(record)))
    print(f"GELU forms record: {path}")


def measure(config: StudyConfig, argv: list[str] | None = None) -> dict[str, Any]:
    """One model's row (module docstring)."""
    from quantstudy.bench.provenance import collect_provenance
    from quantstudy.engines.builders import build_fp8
    from quantstudy.record.build_spec import BuildSpec
    from quantstudy.study.prepare import prepare_study

    start = time.perf_counter()
    prepared = prepare_study(config)
    p = prepared
    engine = build_fp8(p.model, p.device, p.example, p.plan, spec=BuildSpec(kernel="cublaslt"))
    layout = engine.layout
    del engine  # only its record is read: which layers run tanh GELU, which write FP8
    row: dict[str, Any] = {
        "model": config.model,
        "weights": p.model_info.weights,
        "weights_detail": p.model_info.weights_detail,
        "recipe": p.inputs.recipe_source,
        "layers": len(p.layers),
        "n_calib": int(p.calib_x.shape[0]),
        "n_heldout": int(p.heldout_x.shape[0]),
        "tanh_layers": layout.tanh_gelu,
        "gelu_layers": len(layout.gelu),
    }
    row |= _scores(prepared, layout)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["provenance"] = collect_provenance(p.device, argv).model_dump(mode="json")
    return row


def _scores(prepared: Prepared, layout: FP8Layout) -> dict[str, Any]:
    """The codes that differ and each emulation's agreement (module docstring)."""
    import torch

    from quantstudy.bench.options.scores import paired, score
    from quantstudy.engines.builders import build_fakequant
    from quantstudy.engines.run import run_engine, run_half_storage, run_reordered
    from quantstudy.study.prepare import batches

    p, n = prepared, prepared.config.eval_batch
    x, model = p.heldout_x, p.model.to(p.device)
    with torch.no_grad():
        ref = torch.cat([model(b).float().cpu() for b in batches(x, n, p.device)])
    model.cpu()
    erf = build_fakequant(model, p.device, p.example, p.plan)
    with _code_tally(erf.module, layout, prepared) as codes:
        erf_logits = run_engine(erf, x, n).float().cpu()
    reordered = run_reordered(erf, x, n).float().cpu()
    half = run_half_storage(erf, x, getattr(torch, FLOOR_DTYPE), n).float().cpu()
    del erf
    tanh = build_fakequant(model, p.device, p.example, p.plan, like=layout)
    tanh_logits = run_engine(tanh, x, n).float().cpu()
    scores = {
        "erf": score(ref, erf_logits, None),
        "tanh": score(ref, tanh_logits, None),
        "tanh_vs_erf": score(erf_logits, tanh_logits, None),
        "floor": score(erf_logits, reordered, None),
        "half_floor": score(erf_logits, half, None),
    }
    change = paired(scores["erf"], scores["tanh"])
    for s in scores.values():
        del s["per_image"]
    moved = scores["tanh_vs_erf"]["differ"]
    return {
        "fp32_top1_classes": int(ref.argmax(1).unique().numel()),
        "codes": codes,
        **scores,
        "tanh_against_erf": change,
        "within_floor": moved <= scores["floor"]["differ"],
        "within_half_floor": moved <= scores["half_floor"]["differ"],
    }


@dataclass
class _Codes:
    """One layer's tally: the e4m3 codes its GELU input makes through erf and through tanh at
    the reader's input `scale`, how many differ and by at most how many steps."""

    scale: torch.Tensor
    values: int = 0
    differ: int = 0
    max_steps: int = 0

    def hook(self, _module: nn.Module, inputs: tuple[torch.Tensor, ...], _out: object) -> None:
        import torch.nn.functional as F

        from quantstudy.bench.lt_probe import steps
        from quantstudy.quant.formats.fp8 import to_fp8

        y = inputs[0].float()
        d = steps(to_fp8(F.gelu(y), self.scale), to_fp8(F.gelu(y, approximate="tanh"), self.scale))
        self.values += d.numel()
        self.differ += int((d > 0).sum())
        self.max_steps = max(self.max_steps, int(d.max()))


@contextmanager
def _code_tally(
    emulation: nn.Module, layout: FP8Layout, prepared: Prepared
) -> Iterator[dict[str, Any]]:
    """While the erf `emulation` runs, each tanh layer's GELU input through both forms
    (`_Codes`); the tally is filled in when the block ends. A layer that writes no FP8 (no
    hand-off) has no codes to count."""
    import torch

    from quantstudy.quant.plan.apply import gelu_modules

    acts = gelu_modules(emulation, layout.tanh_gelu, prepared.example)
    tallies: dict[str, _Codes] = {}
    hooks = []
    for layer, act in acts.items():
        reader = layout.handoff.get(layer)
        if reader is not None:
            scale = prepared.plan.calibration.scale_of(reader)
            tallies[layer] = _Codes(torch.tensor(scale, dtype=torch.float32))
            hooks.append(emulation.get_submodule(act).register_forward_hook(tallies[layer].hook))
    found: dict[str, Any] = {}
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()
    values = sum(t.values for t in tallies.values())
    differ = sum(t.differ for t in tallies.values())
    found |= {
        "values": values,
        "differ": differ,
        "share": differ / values if values else None,
        "max_steps": max((t.max_steps for t in tallies.values()), default=0),
        "per_layer": {
            k: {"values": t.values, "differ": t.differ, "max_steps": t.max_steps}
            for k, t in tallies.items()
        },
    }


def table(record: dict[str, Any]) -> list[str]:
    """The record as a Markdown table, one row per model."""
    lines = [
        "| model | images | tanh layers | FP8 codes differing | max steps | erf vs fp32 "
        "| tanh vs fp32 | tanh vs erf (differ) | floor: reordered / fp16 storage (differ) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in record["rows"]:
        c = r["codes"]
        share = "n/a" if c["share"] is None else f"{100 * c['share']:.4f}%"
        lines.append(
            f"| {r['model']} ({r['weights']}) | {r['n_heldout']} | {len(r['tanh_layers'])} "
            f"of {r['gelu_layers']} | {share} ({c['differ']} of {c['values']}) "
            f"| {c['max_steps']} | {100 * r['erf']['agreement']:.2f}% "
            f"| {100 * r['tanh']['agreement']:.2f}% | {r['tanh_vs_erf']['differ']} "
            f"| {r['floor']['differ']} / {r['half_floor']['differ']} |"
        )
    return lines
