"""`quantstudy bench report DIR`: every bench record of a folder as Markdown tables.

Nothing is typed by hand: each figure is a field of a record (`schema.py`), each record's section
starts with its provenance, and the speed summary lists every measurement of a model and batch,
newest first, so a change in the code under test reads as a change down a column.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quantstudy.bench.peers.table import peers_section
from quantstudy.bench.products_table import products_section
from quantstudy.bench.schema import (
    DepthwiseBench,
    GemmBench,
    KernelsBench,
    PeersBench,
    ProductsBench,
    PublishedBench,
    Record,
    SpeedBench,
    read_folder,
)
from quantstudy.bench.speed_table import (
    GROUPS,
    TIMED_REGION,
    agreement_lines,
    autotune_lines,
    speed_section,
    speed_summary,
)
from quantstudy.record.io import write_text_atomic
from quantstudy.report.format import code, table

REPORT_NAME = "README.md"


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
        out += [*speed_summary(speed), ""]
        out += agreement_lines(speed) + autotune_lines(speed)
        for name, rec in speed:
            out += speed_section(name, rec, _provenance(rec))
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
