"""The products record as Markdown: per model and batch, the sum over its FP8 layers of our best
product against cuBLASLt's; then one line per distinct product.

Sums weight each product by the layers that run it, so they read as the products' share of one
engine call. Every figure is a field of the record (or a sum of them).
"""

from __future__ import annotations

from collections.abc import Callable

from quantstudy.bench.product_row import CUBLASLT, CUBLASLT_FAST, ProductRow
from quantstudy.bench.schema import ProductsBench
from quantstudy.report.format import table

LT, LT_FAST = CUBLASLT, CUBLASLT_FAST


def _us(v: float | None) -> str:
    return "-" if v is None else ("refused" if v != v else f"{v:.1f}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _sums(rec: ProductsBench) -> list[str]:
    """Per model and batch: ms of products in fp16, cuBLASLt, ours as the engine runs them, and
    our best variant, each summed over the layers that run them; the ratio against cuBLASLt's
    column that sums as our best variant does (`ProductRow.cublaslt_alike`)."""
    head = ["model", "batch", "FP8 layers", "fp16 ms", "cuBLASLt ms", "cuBLASLt fast-accum ms"]
    head += ["ours ms", "best ours ms", "cuBLASLt alike / best ours"]
    rows = []
    for model in dict.fromkeys(m for r in rec.results for m in r.models):
        for batch in rec.batches:
            mine = [r for r in rec.results if model in r.models and r.batch == batch]
            if not mine:
                continue

            def total(
                pick: Callable[[ProductRow], float | None], rows_: list[ProductRow] = mine
            ) -> float | None:
                vals = [(pick(r), r.layers) for r in rows_]
                if any(v is None or v != v for v, _ in vals):
                    return None
                return sum((v or 0.0) * n for v, n in vals) / 1e3

            best = total(lambda r: r.us.get(r.best_ours) if r.best_ours else None)
            alike = total(lambda r: r.us.get(r.cublaslt_alike))  # summing as ours does
            cells = [total(lambda r: r.fp16_us), total(lambda r: r.us.get(LT))]
            cells += [total(lambda r: r.us.get(LT_FAST)), total(lambda r: r.us.get("ours")), best]
            ratio = "-" if alike is None or not best else f"{alike / best:.2f}"
            figures = ["-" if c is None else f"{c:.2f}" for c in cells]
            rows.append([model, str(batch), str(sum(r.layers for r in mine)), *figures, ratio])
    return table(head, rows)


def products_section(name: str, rec: ProductsBench, provenance: list[str]) -> list[str]:
    out = [f"### {name}", "", *provenance]
    peak = rec.peak_fp8_tflops
    out[-1:-1] = [
        f"- rows: {', '.join(rec.models)}; batches {', '.join(map(str, rec.batches))}; "
        f"dense peaks FP8 {peak or '-'} / fp16 {rec.peak_fp16_tflops or '-'} TFLOP/s",
        f"- times: {rec.timed}",
    ]
    if rec.unfinished:
        out[-1:-1] = [f"- unfinished: {rec.unfinished}"]
    out += [*_sums(rec), ""]
    # our variants beside the engine's ("ours"): other accumulation, other epilogues
    # and cuBLASLt's product followed by those epilogues in an Inductor kernel
    extra = [
        k
        for k in dict.fromkeys(k for r in rec.results for k in r.us)
        if k.startswith(("ours ", f"{CUBLASLT} + "))
        and not k.startswith(("ours persistent", "ours pointer", "ours tma"))
    ]
    head = ["kind", "batch", "M", "K", "N", "models", "layers", "fp16 us", "cuBLASLt us"]
    head += ["fast-accum us", "ours us", *(f"{k} us" for k in extra), "best ours", "best us"]
    head += ["best % of peak", "cuBLASLt % of peak", "cuBLASLt alike / best"]
    rows = []
    for r in rec.results:
        best = r.us.get(r.best_ours) if r.best_ours else None
        ratio = "-" if r.best_over_cublaslt is None else f"{r.best_over_cublaslt:.2f}"
        shape = [r.kind, str(r.batch), str(r.m), str(r.k), str(r.n), " ".join(r.models)]
        times = [_us(r.fp16_us), _us(r.us.get(LT)), _us(r.us.get(LT_FAST)), _us(r.us.get("ours"))]
        times += [_us(r.us.get(k)) for k in extra]
        peaks = [_pct(rec.peak_fraction(r, r.best_ours or "")), _pct(rec.peak_fraction(r, LT))]
        rows.append([*shape, str(r.layers), *times, r.best_ours or "-", _us(best), *peaks, ratio])
    return [*out, *table(head, rows), ""]
