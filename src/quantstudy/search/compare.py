"""The search's prediction beside what its studies measured: a finished study's figures
(`measured`), the candidate recipe as a variant of the verifying study, the verifying study's
own figures in its search section, and the terminal's table of both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from quantstudy.record import Measured, SearchSection, StudyRecord, Variant
from quantstudy.record.vocab import Engine
from quantstudy.search.options import option_lines


def measured(record: StudyRecord, folder: Path, batch: int) -> Measured:
    """The figures a finished study measured, for the prediction table."""
    if record.quality is None or record.recipe is None:
        raise RuntimeError(f"study {folder} is not complete")
    by_engine = {e.engine: e for e in record.quality.engines}
    fp8, fq = by_engine[Engine.FP8], by_engine.get(Engine.FAKEQUANT)
    bs = None
    if record.speed is not None:
        bs = next((b for b in record.speed.batches if b.batch == batch), None)
    return Measured(
        study=str(folder),
        recipe=record.recipe.name,
        n_layers=len(record.recipe.selected),
        kl_mean=fp8.kl_mean,
        agreement=fp8.agreement,
        fakequant_kl_mean=fq.kl_mean if fq else None,
        fakequant_agreement=fq.agreement if fq else None,
        batch=batch if bs else None,
        fp16_ms=bs.fp16_ms.median if bs else None,
        fp8_ms=bs.fp8_ms.median if bs else None,
        speedup=bs.ratio.median if bs else None,
        speed_meaningful=bool(record.speed and record.speed.meaningful),
        ship=record.decision.ship if record.decision is not None else None,
    )


def with_verified(searched_dir: Path, batch: int) -> Callable[[StudyRecord], StudyRecord]:
    """How the verifying study completes its record: its own figures in its search section."""

    def complete(record: StudyRecord) -> StudyRecord:
        assert record.search is not None
        verified = measured(record, searched_dir, batch)
        return record.model_copy(
            update={"search": record.search.model_copy(update={"verified": verified})}
        )

    return complete


def candidate_variant(candidate: StudyRecord, search: SearchSection) -> Variant:
    """The candidate recipe as a variant of the verifying study: its own study's FP8 quality
    and speed, with the search's prediction for it."""
    assert candidate.recipe is not None and candidate.quality is not None
    fp8 = next((e for e in candidate.quality.engines if e.engine == Engine.FP8), None)
    return Variant(
        name="candidate",
        recipe=candidate.recipe.source,
        selected_count=len(candidate.recipe.selected),
        quality=fp8,
        speed=candidate.speed.batches if candidate.speed and candidate.speed.batches else None,
        predicted=search.candidate_predicted,
        measured=search.candidate_measured,
    )


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def summary_lines(search: SearchSection) -> list[str]:
    """Prediction next to measurement, for the terminal: candidate recipe and searched recipe
    (after the FP8 quality options the search tried, when it tried any)."""
    lines = [*option_lines(search.options), ""] if search.options else []
    lines += [
        f"{'':30} {'layers':>6} {'KL mean':>10} {'agreement':>9} {'saved ms':>9} "
        f"{'fp8 ms':>8} {'x':>6}",
    ]

    def row(
        label: str,
        n: int,
        kl: float,
        agree: float,
        saved: float | None,
        fp8: float | None,
        x: float | None,
    ) -> str:
        return (
            f"{label:30} {n:>6} {kl:>10.3g} {100 * agree:>8.2f}% {_fmt(saved, '.4f'):>9} "
            f"{_fmt(fp8, '.4f'):>8} {_fmt(x, '.3f'):>6}"
        )

    for label, pred, meas in (
        ("candidate", search.candidate_predicted, search.candidate_measured),
        ("searched", search.predicted, search.verified),
    ):
        lines.append(
            row(
                f"{label} predicted",
                len(pred.layers),
                pred.kl_mean,
                pred.agreement,
                pred.saved_ms,
                pred.fp8_ms,
                pred.speedup,
            )
        )
        if meas is not None:
            saved = None
            if meas.fp16_ms is not None and meas.fp8_ms is not None:
                saved = meas.fp16_ms - meas.fp8_ms
            note = "" if meas.speed_meaningful else " (CPU time)"
            lines.append(
                row(
                    f"{label} measured{note}",
                    meas.n_layers,
                    meas.kl_mean,
                    meas.agreement,
                    saved,
                    meas.fp8_ms,
                    meas.speedup,
                )
            )
    return lines
