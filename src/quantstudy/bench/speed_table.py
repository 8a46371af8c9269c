"""A speed record (`quantstudy bench speed`) as Markdown: every x per model, batch and FP8
kernel across the folder's records, newest first; then per record its engines' times and
kernel groups. `report.py` puts it in the folder's report.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantstudy.bench.schema import EngineSpeed, SpeedBench, SpeedResult
from quantstudy.bench.speed_claims import engine_claims, logged_claim, x_cell
from quantstudy.quant import backends
from quantstudy.record import TimingStats
from quantstudy.record.vocab import Engine, KernelGroup
from quantstudy.report.claims import claim_of, legend
from quantstudy.report.format import code, table

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


def _spread(t: TimingStats, digits: int) -> str:
    return f"{t.median:.{digits}f} [{t.q1:.{digits}f}-{t.q3:.{digits}f}]"


def _opt(v: object) -> str:
    return "-" if v is None else str(v)


def _fused_ratios(r: SpeedResult, e: EngineSpeed) -> Iterable[tuple[int, str]]:
    return ((batch, x_cell(claim)) for batch, claim in engine_claims(e))


def speed_summary(speed: list[tuple[str, SpeedBench]]) -> list[str]:
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


def agreement_lines(speed: list[tuple[str, SpeedBench]]) -> list[str]:
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


def autotune_lines(speed: list[tuple[str, SpeedBench]]) -> list[str]:
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


def speed_section(name: str, rec: SpeedBench, provenance: list[str]) -> list[str]:
    """One speed record: its settings after its `provenance` lines, a row per engine and batch,
    and the kernel time per group where the record profiled it."""
    settings = (
        f"- settings: {rec.n_images} images of {code(rec.images)}, batches "
        f"{','.join(map(str, rec.batches))}, {rec.rounds} rounds of {rec.iters} calls, "
        f"compile mode {rec.compile_mode}"
    )
    out = [f"### {name}", "", *provenance]
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
