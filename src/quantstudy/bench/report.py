"""`quantstudy bench report DIR`: every bench record of a folder as Markdown tables.

Nothing is typed by hand: each figure is a field of a record (`schema.py`), each record's section
starts with its provenance, and the speed summary lists every measurement of a model and batch,
newest first, so a change in the code under test reads as a change down a column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quantstudy.bench.peers.table import peers_section
from quantstudy.bench.products_table import products_section
from quantstudy.bench.schema import (
    DepthwiseBench,
    EngineSpeed,
    GemmBench,
    KernelsBench,
    PeersBench,
    ProductsBench,
    PublishedBench,
    Record,
    SpeedBench,
    SpeedResult,
    read_folder,
)
from quantstudy.bench.speed_claims import engine_claims, logged_claim, x_cell
from quantstudy.quant import backends
from quantstudy.record import TimingStats
from quantstudy.record.io import write_text_atomic
from quantstudy.record.vocab import Engine, KernelGroup
from quantstudy.report.claims import claim_of, legend
from quantstudy.report.format import code, table

REPORT_NAME = "README.md"
GROUPS = list(KernelGroup)
TIMED_REGION = (
    "Speed records time CUDA-graph replays of one engine call on a device-resident, pre-cast "
    "input of real images; fp16 and FP8 rounds interleaved; x = fp16 ms / FP8 ms per round pair "
    "(`src/quantstudy/speed/harness.py`). FP8 layers (real/emulated): layers running a real FP8 "
    "product with the named kernel / layers quantize-dequantized around an fp16 op; '+N fp16': "
    "recipe layers the `fastest` choice kept in fp16, where FP8 was slower at every timed batch "
    "(`engines/step_aside.py`). `fused` is one "
    "Triton kernel per FP8 layer with scale, bias and the absorbed activation in its epilogue "
    "(`quant/kernels/gemm.py`); `scaled_mm` is torch._scaled_mm followed by its cast, bias and "
    "activation. Acts/hand-offs: activations computed in fused epilogues / FP8 layers writing the "
    "next FP8 layer's input ('-': not counted by that record)."
)


def natural_key(name: str) -> list[int | str]:
    """Names in natural order: a2 before a10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def render_folder(folder: Path) -> str:
    # oldest first (by the time each record was written, then by name): "newest first" below
    # and the order of the sections follow the history of the code under test
    records = sorted(
        read_folder(folder), key=lambda nr: (nr[1].provenance.created_utc or "", natural_key(nr[0]))
    )
    speed = [(n, r) for n, r in records if isinstance(r, SpeedBench)]
    out = [
        "# Benchmark results",
        "",
        f"Rendered by `quantstudy bench report` from the {len(records)} records in this folder; "
        "every figure is a field of a record, and each record names the command, code, GPU and "
        "versions that produced it.",
        "",
    ]
    if speed:
        out += ["## Speed: fp16 engine against FP8 engines", "", TIMED_REGION, ""]
        out += [*_speed_summary(speed), ""]
        out += _agreement_lines(speed) + _autotune_lines(speed)
        for name, rec in speed:
            out += _speed_section(name, rec)
    sections: dict[type[BaseModel], tuple[str, Callable[[str, Any], list[str]]]] = {
        ProductsBench: ("## Every FP8 product of the peers rows, beside cuBLASLt", _products),
        GemmBench: ("## FP8 products alone", _gemm_section),
        DepthwiseBench: ("## Depthwise convolutions alone", _depthwise_section),
        KernelsBench: ("## Every kernel of one engine call", _kernels_section),
        PeersBench: ("## Side by side: fp16, our FP8 engine, torchao", _peers_section),
        PublishedBench: ("## Published figures, for comparison", _published_section),
    }
    for kind, (title, render) in sections.items():
        chosen = [(n, r) for n, r in records if isinstance(r, kind)]
        if chosen:
            out += [title, ""]
            for name, one in chosen:
                out += render(name, one)
    return "\n".join(out).rstrip("\n") + "\n"


def write_report(folder: Path) -> Path:
    path = folder / REPORT_NAME
    write_text_atomic(path, render_folder(folder))
    return path


# --- shared --------------------------------------------------------------------------------


def _spread(t: TimingStats, digits: int) -> str:
    return f"{t.median:.{digits}f} [{t.q1:.{digits}f}-{t.q3:.{digits}f}]"


def _opt(v: object) -> str:
    return "-" if v is None else str(v)


def _provenance(rec: Record) -> list[str]:
    p = rec.provenance
    gpu = p.gpu_name or "no GPU"
    if p.gpu_capability:
        gpu += f" (compute capability {p.gpu_capability})"
    versions = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("driver", p.gpu_driver),
            ("CUDA", p.cuda),
            ("cuDNN", p.cudnn),
            ("torch", p.torch),
            ("Triton", p.triton),
            ("timm", p.timm),
            ("Python", p.python),
            ("torchao", p.torchao),
        )
        if v
    )
    lines = [
        f"- command: {code(p.command)}",
        f"- code: commit {code(p.git_commit or 'unknown')}" + (f"; {p.code}" if p.code else ""),
        f"- device: {p.device}, {gpu}; {versions or 'versions not recorded'}",
    ]  # the time of the run stays in the record (`created_utc`): the commit places it
    if not rec.meaningful:
        lines.append(f"- **not meaningful as speed evidence**: {rec.meaningless_reason}")
    if rec.unfinished:
        lines.append(f"- **unfinished** (the run was cut): {rec.unfinished}")
    if p.lab_switches:  # engines built or tuned otherwise than the commit says
        lines.append(f"- lab switches: {code(p.lab_switches)}")
    if p.note:
        lines.append(f"- note: {p.note}")
    return [*lines, ""]


# --- speed ---------------------------------------------------------------------------------


def _fused_ratios(r: SpeedResult, e: EngineSpeed) -> Iterable[tuple[int, str]]:
    return ((batch, x_cell(claim)) for batch, claim in engine_claims(e))


def _speed_summary(speed: list[tuple[str, SpeedBench]]) -> list[str]:
    """Every measured x per model, batch and FP8 kernel, newest record first."""
    rows: dict[tuple[str, int, str], list[tuple[str, str]]] = {}
    for name, rec in speed:
        for r in rec.results:
            for e in r.engines:
                for batch, x in _fused_ratios(r, e):
                    key = (r.model, batch, e.fp8_kernel)
                    rows.setdefault(key, []).insert(0, (x, name))
    order = backends.options()  # a record's backend this install lacks goes last
    rank = {k: i for i, k in enumerate(order)}
    ordered = sorted(rows, key=lambda k: (k[0], k[1], rank.get(k[2], len(order)), k[2]))
    body = [
        [model, str(batch), kernel, x, name]
        for model, batch, kernel in ordered
        for x, name in rows[(model, batch, kernel)]
    ]
    head = ["model", "batch", "FP8 kernel", "x median [q1-q3]", "record"]
    claims = [c for _, rec in speed for r in rec.results for e in r.engines
              for _, c in engine_claims(e)]  # fmt: skip
    return [
        "### Every measured x per model and batch, newest first",
        "",
        *table(head, body),
        "",
        *legend(claims, ms_shown=False),
    ]


def _agreement_lines(speed: list[tuple[str, SpeedBench]]) -> list[str]:
    lines = [
        f"- {r.model} ({name}): fused against unfused FP8 engine, top-1 agreement "
        f"{a.same_top1 / a.n_images:.4f} ({a.same_top1} of {a.n_images} images)"
        for name, rec in speed
        for r in rec.results
        if (a := r.fused_vs_unfused) is not None
    ]
    if not lines:
        return []
    return [
        "Fused against unfused FP8 engine on the same images (same quantization):",
        "",
        *lines,
        "",
    ]


def _autotune_lines(speed: list[tuple[str, SpeedBench]]) -> list[str]:
    lines = []
    for name, rec in speed:
        for r in rec.results:
            for b in r.fp16_max_autotune.batches if r.fp16_max_autotune else []:
                lines.append(
                    f"- {r.model} ({name}), batch {b.batch}: default {_spread(b.fp16_ms, 3)} ms, "
                    f"max-autotune {_spread(b.fp8_ms, 3)} ms, default / max-autotune "
                    f"{_spread(b.ratio, 3)}"
                )
            if r.fp16_max_autotune_logged:
                batch, default, tuned = r.fp16_max_autotune_logged
                lines.append(
                    f"- {r.model} ({name}), batch {batch}: default {default:.3f} ms, "
                    f"max-autotune {tuned:.3f} ms (medians)"
                )
    if not lines:
        return []
    head = "The fp16 engine in default mode against max-autotune (above 1: max-autotune faster):"
    return [head, "", *lines, ""]


def _speed_section(name: str, rec: SpeedBench) -> list[str]:
    settings = (
        f"- settings: {rec.n_images} images of {code(rec.images)}, batches "
        f"{','.join(map(str, rec.batches))}, {rec.rounds} rounds of {rec.iters} calls, "
        f"compile mode {rec.compile_mode}"
    )
    out = [f"### {name}", "", *_provenance(rec)]
    out[-1:-1] = [settings]
    head = [
        "model",
        "FP8 kernel",
        "recipe",
        "FP8 layers (real/emulated)",
        "acts / hand-offs",
        "batch",
        "fp16 ms [q1-q3]",
        "FP8 ms [q1-q3]",
        "x median [q1-q3]",
        "kernels fp16/FP8",
    ]
    rows = [row for r in rec.results for e in r.engines for row in _speed_rows(r, e)]
    claims = [c for r in rec.results for e in r.engines for _, c in engine_claims(e)]
    out += [*table(head, rows), "", *legend(claims), ""]
    kernel_rows = _kernel_rows(rec)
    if kernel_rows:
        out += [
            "Kernel time per group (us per call, one profiled call outside CUDA graphs):",
            "",
            *table(
                ["model", "batch", "engine", "kernels", "total us", *GROUPS, "fused kernel us"],
                kernel_rows,
            ),
            "",
        ]
    return out


def _speed_rows(r: SpeedResult, e: EngineSpeed) -> list[list[str]]:
    lead = [
        r.model,
        str(e.fp8_kernel),
        r.recipe.removeprefix("builtin:"),
        f"{_opt(e.fp8_real)}/{_opt(e.fp8_emulated)}"
        + (f" +{e.fp8_stepped_aside} fp16" if e.fp8_stepped_aside else ""),
        f"{_opt(e.epilogue_activations)}/{_opt(e.fp8_handoffs)}",
    ]
    rows = []
    if e.speed is not None:
        counts = {(k.engine, k.batch): k.kernel_count for k in e.speed.kernels}
        for b in e.speed.batches:
            k16, k8 = counts.get((Engine.FP16, b.batch)), counts.get((Engine.FP8, b.batch))
            rows.append(
                [
                    *lead,
                    str(b.batch),
                    _spread(b.fp16_ms, 3),
                    _spread(b.fp8_ms, 3),
                    x_cell(claim_of(b)),
                    f"{_opt(k16)}/{_opt(k8)}",
                ]
            )
    for logged in e.logged or []:
        rows.append(
            [
                *lead,
                str(logged.batch),
                f"{logged.fp16_ms:.3f}",
                f"{logged.fp8_ms:.3f}",
                x_cell(logged_claim(logged)),
                f"{logged.fp16_kernels}/{logged.fp8_kernels}",
            ]
        )
    return rows


OWN_KERNEL = "_fp8_gemm_kernel"


def _kernel_rows(rec: SpeedBench) -> list[list[str]]:
    """fp16 once per result, then each FP8 engine; the last column is the fused product alone
    (quantstudy's own kernel, where the profile's top kernels list it)."""
    rows = []
    for r in rec.results:
        fp16_done = False
        for e in r.engines:
            for k in e.speed.kernels if e.speed else []:
                if k.engine == Engine.FP16:
                    if fp16_done:
                        continue
                    engine = str(Engine.FP16)
                else:
                    engine = f"{k.engine} ({e.fp8_kernel})"
                by = {g.group: g.time_us for g in k.groups}
                own = dict(k.top_kernels).get(OWN_KERNEL)
                rows.append(
                    [r.model, str(k.batch), engine, str(k.kernel_count), f"{k.total_us:.0f}"]
                    + [f"{by.get(g, 0.0):.0f}" for g in GROUPS]
                    + ["-" if own is None else f"{own:.0f}"]
                )
            fp16_done = fp16_done or any(
                k.engine == Engine.FP16 for k in (e.speed.kernels if e.speed else [])
            )
            for b in e.logged or []:
                rows.append(
                    [r.model, str(b.batch), f"fp8 ({e.fp8_kernel})", str(b.fp8_kernels), "-"]
                    + [f"{b.fp8_groups_us.get(g, 0.0):.0f}" for g in GROUPS]
                    + ["-"]
                )
    return rows


# --- gemm, depthwise, kernels, published ---------------------------------------------------


def _us(v: float | None) -> str:
    return "-" if v is None else ("refused" if v != v else f"{v:.1f}")


TILE = re.compile(r"\d+x\d+")
REFERENCES = ["fp16 conv", "fp16 mm", "scaled_mm"]


def _gemm_section(name: str, rec: GemmBench) -> list[str]:
    out = [f"### {name}", "", *_provenance(rec)]
    out[-1:-1] = [f"- batch {rec.batch}; times: {rec.timed}"]
    # every variant but the swept tiles ("pointer 128x64x32x4x4"), the references first
    cols = list(dict.fromkeys(k for r in rec.results for k in r.us if not TILE.search(k)))
    cols.sort(key=lambda c: REFERENCES.index(c) if c in REFERENCES else len(REFERENCES))
    head = ["model", "M", "K", "N", "layers", *(f"{c} us" for c in cols)]
    head += ["best Triton", "best us", "roofline us", "best / roofline"]
    rows = []
    for r in rec.results:
        best = r.us.get(r.best_triton) if r.best_triton else None
        rows.append(
            [r.model, str(r.m), str(r.k), str(r.n), str(len(r.layers))]
            + [_us(r.us.get(c)) for c in cols]
            + [r.best_triton or "-", _us(best), f"{r.roofline_us:.1f}"]
            + ["-" if best is None else f"{best / r.roofline_us:.2f}"]
        )
    return [*out, *table(head, rows), ""]


def _depthwise_section(name: str, rec: DepthwiseBench) -> list[str]:
    out = [f"### {name}", "", *_provenance(rec)]
    variants = list(rec.results[0].bytes) if rec.results else []
    head = ["model", "C", "k", "stride", "input", "layers", *(f"{v} us" for v in variants)]
    head += [f"roofline {v} us" for v in variants]
    rows = [
        [
            r.model,
            str(r.c),
            str(r.k),
            str(r.stride),
            "x".join(map(str, r.input)),
            str(len(r.layers)),
        ]
        + [_us(r.us.get(v)) for v in variants]
        + [f"{r.roofline_us[v]:.1f}" for v in variants]
        for r in rec.results
    ]
    return [*out, *table(head, rows), ""]


def _kernels_section(name: str, rec: KernelsBench) -> list[str]:
    out = [f"### {name}", "", *_provenance(rec)]
    out[-1:-1] = [f"- {rec.model}, {rec.recipe}, batch {rec.batch}, FP8 kernel {rec.fp8_kernel}"]
    head = ["compile", "engine", "kernels", "total us", *GROUPS, "slowest kernels (us)"]
    rows = []
    for i, compiled in enumerate(rec.compiles):
        for engine, kernels in compiled.items():
            by = {g: sum(k.us for k in kernels if k.group == g) for g in GROUPS}
            top = ", ".join(f"{k.kernel} {k.us:.0f}" for k in kernels[:3])
            rows.append(
                [str(i), engine, str(len(kernels)), f"{sum(k.us for k in kernels):.0f}"]
                + [f"{by[g]:.0f}" for g in GROUPS]
                + [top]
            )
    return [*out, *table(head, rows), ""]


def _products(name: str, rec: ProductsBench) -> list[str]:
    return products_section(name, rec, _provenance(rec))


def _peers_section(name: str, rec: PeersBench) -> list[str]:
    return peers_section(name, rec, _provenance(rec))


def _published_section(name: str, rec: PublishedBench) -> list[str]:
    out = [
        f"### {name}",
        "",
        rec.title,
        "",
        *_provenance(rec),
    ]
    head = ["model", "GPU", "TensorRT", "opt level", "batch", "fp16 ms", "FP8 ms", "x", "source"]
    rows = [
        [
            f.model,
            f.gpu,
            f.tensorrt,
            "not stated" if f.opt_level is None else str(f.opt_level),
            str(f.batch),
            "-" if f.fp16_ms is None else f"{f.fp16_ms:.3f}",
            "-" if f.fp8_ms is None else f"{f.fp8_ms:.3f}",
            f"{f.x:.2f}",
            f.source,
        ]
        for f in rec.figures
    ]
    return [*out, *table(head, rows), ""]
