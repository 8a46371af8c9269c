"""NaN/Inf scan: every held-out image and stress input whose logits are not all finite, by name.

A non-finite logit is a broken prediction, not a small numerical error, so the scan names each row
instead of counting it away. `finite_rows` is the one definition of "finite row" that the metrics
also use, so the rows left out of KL are exactly the rows named here.
"""

from __future__ import annotations

import numpy as np
import torch

from quantstudy.record import NonFiniteScan


def finite_rows(logits: torch.Tensor) -> np.ndarray:
    """Boolean mask over the rows of an (N, C) logit tensor: True where every logit is finite."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (N, C), got shape {tuple(logits.shape)}")
    return torch.isfinite(logits).all(dim=1).cpu().numpy()


def nonfinite_names(logits: torch.Tensor, names: list[str]) -> list[str]:
    """The names of the rows of `logits` that hold a NaN or Inf, in row order."""
    if logits.shape[0] != len(names):
        raise ValueError(f"{logits.shape[0]} logit rows but {len(names)} names")
    bad = ~finite_rows(logits)
    return [name for name, is_bad in zip(names, bad, strict=True) if is_bad]


def scan_nonfinite(
    engine: str,
    heldout_logits: torch.Tensor,
    heldout_ids: list[str],
    stress_logits: torch.Tensor,
    stress_names: list[str],
) -> NonFiniteScan:
    """Scan one engine's held-out and stress logits; every non-finite row is named in the record."""
    return NonFiniteScan(
        engine=engine,
        heldout_checked=len(heldout_ids),
        stress_checked=len(stress_names),
        nonfinite_heldout=nonfinite_names(heldout_logits, heldout_ids),
        nonfinite_stress=nonfinite_names(stress_logits, stress_names),
    )


def scan_rows(
    engine: str,
    heldout_valid: np.ndarray,
    heldout_ids: list[str],
    stress_logits: torch.Tensor,
    stress_names: list[str],
) -> NonFiniteScan:
    """`scan_nonfinite` from the held-out rows' finite mask (`quality/image_scores.py`), for a pass
    that keeps no held-out logits."""
    if len(heldout_valid) != len(heldout_ids):
        raise ValueError(f"{len(heldout_valid)} held-out rows but {len(heldout_ids)} ids")
    bad = [heldout_ids[i] for i in np.flatnonzero(~np.asarray(heldout_valid, dtype=bool))]
    return NonFiniteScan(
        engine=engine,
        heldout_checked=len(heldout_ids),
        stress_checked=len(stress_names),
        nonfinite_heldout=bad,
        nonfinite_stress=nonfinite_names(stress_logits, stress_names),
    )
