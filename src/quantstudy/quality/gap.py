"""The FP8 engine against its own fake-quant emulation, image by image, so "the loss comes from
the recipe, not the engine" is a measurement, read against floors (the emulation run again with
its fp32 sums reordered, or its stored values rounded to a half dtype) that no distinct kernel can
be expected to beat.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from quantstudy.quality.image_scores import Pair, Predictions, RowSet
from quantstudy.quality.metrics import KLStats, check_logits
from quantstudy.quality.paired import mcnemar_exact
from quantstudy.record import EmulationGap
from quantstudy.record.vocab import Engine


def _split(ref: Predictions, a: Predictions, b: Predictions) -> tuple[int, int, float]:
    """Images only `a` differs from `ref` on, those only `b` does, and McNemar's exact p."""
    a_same, b_same = ref.agrees_with(a), ref.agrees_with(b)
    a_only, b_only = int((~a_same & b_same).sum()), int((a_same & ~b_same).sum())
    return a_only, b_only, mcnemar_exact(b_only, a_only)


def emulation_gap(
    fp8_logits: torch.Tensor,
    fakequant_logits: torch.Tensor,
    reordered_logits: torch.Tensor | None = None,
    reference_logits: torch.Tensor | None = None,
    float32_logits: torch.Tensor | None = None,
    half_storage: tuple[torch.Tensor, torch.dtype] | None = None,
) -> EmulationGap:
    """FP8 engine against its fake-quant emulation: top-1 agreement and KL(fakequant || fp8).

    Compared image by image, not by mean KL alone: two engines can have equal mean KL against
    fp32 and still err on different images. Non-finite rows count as differing and are left out
    of KL, as in `score_engine`.

    `reordered_logits` is the emulation run again with only its fp32 summation order changed; its
    agreement with the emulation is the floor below which no distinct kernel can be expected to
    go, since FP8 rounding amplifies reassociation noise.

    With `reference_logits` (fp32), the images where exactly one of the two differs from the
    reference are split by which one, with McNemar's exact test on that split: it tells an
    engine that loses more images than its recipe from one that loses different ones (an
    engine computing in fp16 between its FP8 layers cannot reach the fp32 floor). The test
    holds the emulation fixed, yet the emulation is one of many equally correct computations
    of the recipe, so the reordered run is split against it the same way: a split as uneven
    as the floor's says nothing about the engine (on Lite0 two fp32 sum orders of one
    emulation split 14 / 3, p = 0.013).

    `float32_logits` is the same FP8 engine built in float32: its gap to the emulation is the
    FP8 arithmetic's alone, to be read against the floor.

    `half_storage` is the emulation run again with its stored values rounded to a half dtype
    (`engines.run.run_half_storage`), and that dtype: its agreement with the emulation is the
    floor for an engine that stores in that dtype between its layers.
    """
    check_logits(fakequant_logits, fp8_logits, None)
    if reference_logits is not None:
        check_logits(reference_logits, fp8_logits, None)
    named = {
        Engine.FP8: fp8_logits,
        Engine.FAKEQUANT: fakequant_logits,
        "fakequant_reordered": reordered_logits,
        Engine.FP32: reference_logits,
        "fp8_float32": float32_logits,
        "fakequant_half": half_storage[0] if half_storage else None,
    }
    logits = {k: v for k, v in named.items() if v is not None}
    rows = RowSet.of(logits, gap_pairs(logits), None)
    return emulation_gap_rows(rows, half_storage[1] if half_storage else None)


def gap_pairs(engines: Iterable[str]) -> list[Pair]:
    """The pairs `emulation_gap_rows` reads, for the engines present: each against the
    emulation (`fakequant`), as (emulation, engine)."""
    names = set(engines)
    return [(Engine.FAKEQUANT, n) for n in GAP_ENGINES if n in names]


GAP_ENGINES = (Engine.FP8, "fakequant_reordered", "fp8_float32", "fakequant_half")


def emulation_gap_rows(rows: RowSet, half_dtype: torch.dtype | None = None) -> EmulationGap:
    """`emulation_gap` from per-image rows: the engines named as in `emulation_gap`'s keys
    (fp8, fakequant, and where present fakequant_reordered, fp32, fp8_float32, fakequant_half),
    with the pairs of `gap_pairs`."""
    e = rows.engines
    floor = _agreement(rows, "fakequant_reordered")
    wide = _agreement(rows, "fp8_float32")
    half = _agreement(rows, "fakequant_half")
    emu, fp8 = e[Engine.FAKEQUANT], e[Engine.FP8]
    agree = emu.agrees_with(fp8)
    stats = KLStats.of(rows.pairs[(Engine.FAKEQUANT, Engine.FP8)].finite_kl)
    split: dict[str, Any] = {}
    if Engine.FP32 in e:
        ref = e[Engine.FP32]
        engine_only, emulation_only, p = _split(ref, fp8, emu)
        split = {
            "engine_only_differ": engine_only,
            "emulation_only_differ": emulation_only,
            "split_mcnemar_p": p,
        }
        if "fakequant_reordered" in e:
            only, emulation_only, p = _split(ref, e["fakequant_reordered"], emu)
            split |= {
                "floor_only_differ": only,
                "floor_emulation_only_differ": emulation_only,
                "floor_split_mcnemar_p": p,
            }
    return EmulationGap(
        agreement=float(agree.mean()),
        differ_count=int(agree.size - agree.sum()),
        kl_mean=stats.mean,
        kl_max=stats.max,
        floor_agreement=floor.agreement if floor else None,
        floor_differ_count=floor.differ_count if floor else None,
        floor_kl_mean=floor.kl_mean if floor else None,
        **split,
        float32_agreement=wide.agreement if wide else None,
        float32_differ_count=wide.differ_count if wide else None,
        float32_kl_mean=wide.kl_mean if wide else None,
        half_floor_dtype=str(half_dtype).removeprefix("torch.") if half else None,
        half_floor_agreement=half.agreement if half else None,
        half_floor_differ_count=half.differ_count if half else None,
        half_floor_kl_mean=half.kl_mean if half else None,
    )


@dataclass(frozen=True)
class _Agreement:
    agreement: float
    differ_count: int
    kl_mean: float


def _agreement(rows: RowSet, engine: str) -> _Agreement | None:
    """`engine` against the emulation: agreement, differing images, mean KL(emulation || it)."""
    if engine not in rows.engines:
        return None
    agree = rows.engines[Engine.FAKEQUANT].agrees_with(rows.engines[engine])
    stats = KLStats.of(rows.pairs[(Engine.FAKEQUANT, engine)].finite_kl)
    return _Agreement(float(agree.mean()), int(agree.size - agree.sum()), stats.mean)
