"""Before any heavy work: what the chosen number of held-out images can resolve.

The top-1 gate's interval width depends on how many images change correctness between FP8 and
its baseline, which is unknown before the study runs. The preview assumes the largest share the
agreement gate lets through, 1 - `quality.agreement.min`: an engine that changes more
predictions than that fails agreement anyway (a changed correctness is a changed prediction).
With that share d, a true change of 0 settles a margin m with `stats.POWER` once
n >= (z + z_power)^2 d / m^2 (`stats.images_for_margin`).
"""

from __future__ import annotations

from quantstudy.decision import stats
from quantstudy.decision.schema import Policy


def heldout_preview(policy: Policy, heldout: int, labelled: bool) -> str:
    """One or two lines: the loss the top-1 gate can resolve, and a warning when the policy's
    margin cannot be met at this size."""
    tp = policy.quality.top1
    if not labelled:
        return (
            f"with {heldout:,} unlabelled held-out images the top-1 gate cannot be evaluated "
            + ("(the policy requires labels)" if tp.require_labels else "(skipped)")
        )
    rate = 1.0 - policy.quality.agreement.min
    c = policy.confidence
    loss = 100.0 * stats.resolvable_change(rate, heldout, c)
    line = (
        f"with {heldout:,} held-out images the top-1 gate can resolve a loss of about "
        f"{loss:.2f} points against {tp.baseline} (assuming at most {100 * rate:g}% of "
        f"images change correctness, {100 * c:g}% intervals)"
    )
    margin = tp.margin_points / 100.0
    if margin == 0.0:
        return line + "\nwarning: a top-1 margin of 0 points can never pass; expect inconclusive"
    if loss / 100.0 > margin:
        needed = stats.about(stats.images_for_margin(rate, margin, c))
        line += (
            f"\nwarning: the policy's {tp.margin_points:g}-point top-1 margin needs about "
            f"{needed:,} labelled held-out images at that rate; with {heldout:,} the top-1 gate "
            "is likely inconclusive unless FP8 changes fewer predictions"
        )
    return line
