"""Scores of one engine's logits against a reference, and two scores of the same images paired.

The options table compares variants whose differing-image counts are a few dozen: such counts
move by several images between two runs that differ only in a scale's last bit
(docs/fp8-options.md, "The comparison: `quantstudy bench options`"), so a variant is said to
beat another only by the paired interval on the same images, never by the raw counts. A score
therefore keeps its per-image KL and which images differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from quantstudy.quality.image_scores import kl_per_image
from quantstudy.quality.paired import PAIRED_RESAMPLES, paired_bootstrap, paired_mean_change
from quantstudy.record.vocab import Engine


def score(ref: torch.Tensor, out: torch.Tensor, labels: np.ndarray | None) -> dict[str, Any]:
    """Against the reference logits `ref`: differing top-1s, agreement, KL mean, the top-1
    change with its paired-bootstrap 95% interval (with labels), and per image the KL and
    which top-1s differ (for `paired`)."""
    differs = (out.argmax(1) != ref.argmax(1)).numpy()
    differ = int(differs.sum())
    kl = kl_per_image(ref, out)
    result: dict[str, Any] = {
        "differ": differ,
        "n": len(ref),
        "agreement": 1 - differ / len(ref),
        "kl_mean": float(np.mean(kl)),
        "top1_change": None,
        "top1_low": None,
        "top1_high": None,
    }
    if labels is not None:
        ref_ok = (ref.argmax(1).numpy() == labels).astype(np.int64)
        out_ok = (out.argmax(1).numpy() == labels).astype(np.int64)
        ci = paired_bootstrap(ref_ok, out_ok, resamples=2000, seed=0)
        result |= {"top1_change": ci.change, "top1_low": ci.low, "top1_high": ci.high}
    result["per_image"] = {
        "kl": [float(f"{v:.6g}") for v in np.asarray(kl, dtype=np.float64)],
        "differ": np.flatnonzero(differs).tolist(),
    }
    return result


def paired(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`other` against `base`, two scores of the same images: the change in KL mean and in
    the number of differing top-1s, each with its 95% paired bootstrap interval."""
    n = base["n"]
    flags = []
    for s in (base, other):
        f = np.zeros(n)
        f[s["per_image"]["differ"]] = 1.0
        flags.append(f)
    kl = paired_mean_change(
        np.asarray(base["per_image"]["kl"]), np.asarray(other["per_image"]["kl"]),
        resamples=PAIRED_RESAMPLES, seed=0,
    )  # fmt: skip
    count = paired_mean_change(*flags, resamples=PAIRED_RESAMPLES, seed=0)
    return {
        "kl_mean_change": kl.change,
        "kl_low": kl.low,
        "kl_high": kl.high,
        "differ_change": other["differ"] - base["differ"],
        "differ_low": count.low * n,
        "differ_high": count.high * n,
    }


def row_line(row: dict[str, Any]) -> str:
    """One console line per variant: each engine's score, the pairing with the first
    variant, the tuning's held-out KL and the plan's time."""
    parts = [row["variant"]]
    extra = [k for k in row if k.startswith("fp8_") and k != "fp8_vs_fakequant"]
    stored = [k for k in row if k.startswith(("floor_", "fakequant_"))]
    for engine in (Engine.FAKEQUANT, Engine.FP8, "fp8_vs_fakequant", *extra, "floor", *stored):
        if engine in row:
            parts.append(f"{engine}: {_score_text(row[engine])}")
    for engine, c in row.get("against_first", {}).items():
        parts.append(
            f"{engine} - first: KL {c['kl_mean_change']:+.4f} [{c['kl_low']:+.4f}, "
            f"{c['kl_high']:+.4f}], differ {c['differ_change']:+d} [{c['differ_low']:+.0f}, "
            f"{c['differ_high']:+.0f}]"
        )
    if "tuning" in row:
        (before, after), epoch = row["tuning"]["heldout_kl"], row["tuning"]["epoch"]
        parts.append(f"tuning: held-out KL {before:.4f} -> {after:.4f} (epoch {epoch})")
    parts.append(f"plan {row['plan_seconds']:.1f} s")
    return " | ".join(parts)


def _score_text(r: dict[str, Any]) -> str:
    text = f"{r['differ']}/{r['n']} differ, agreement {r['agreement']:.4f}, KL {r['kl_mean']:.4f}"
    if r["top1_change"] is not None:
        text += (
            f", top-1 {r['top1_change'] * 100:+.2f} "
            f"[{r['top1_low'] * 100:+.2f}, {r['top1_high'] * 100:+.2f}] pt"
        )
    return text
