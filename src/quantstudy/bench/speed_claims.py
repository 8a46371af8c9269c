"""A speed record's x read through `report/claims.py`, for the tables of `bench report`: each
engine's x per batch with its claim (a run known only from its log too), and its cell."""

from __future__ import annotations

from quantstudy.bench.schema import EngineSpeed, LoggedBatch
from quantstudy.report.claims import XClaim, claim_of


def engine_claims(e: EngineSpeed) -> list[tuple[int, XClaim]]:
    """Each batch's x of the engine with its claim, a logged one too."""
    found = [(b.batch, claim_of(b)) for b in e.speed.batches] if e.speed is not None else []
    return found + [(b.batch, logged_claim(b)) for b in e.logged or []]


def logged_claim(b: LoggedBatch) -> XClaim:
    """A logged batch keeps medians and the ratio's quartiles, not the engines' spreads."""
    return XClaim(
        x=b.ratio_median, q1=b.ratio_q1, q3=b.ratio_q3, fp16_ms=b.fp16_ms, fp8_ms=b.fp8_ms
    )


def x_cell(claim: XClaim) -> str:
    """x [q1-q3] with its marks: "not settled" where [q1, q3] contains 1.0, noisy engines."""
    return claim.cell(f"{claim.x:.2f} [{claim.q1:.2f}-{claim.q3:.2f}]")
