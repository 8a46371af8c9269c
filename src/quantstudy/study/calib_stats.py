"""Calibration statistics shared by the studies of a host: observed once per (model, data,
calibration images), reused by every recipe, calibrator and FP8 kernel that needs them.

What is shared, and why it is exact: `quant.calibration.calibrate.InputStats`, everything
calibration observes of one layer's input (max |x|, the fixed log-binned histogram of |x|, the
non-finite count, per-channel sums and maxima, and the second moment when compensating rounding asks
for it). Every calibrator (max, percentile, mse, entropy, with any parameters) computes its amax
from those observations alone, so a study that reads them computes the scales, means and moments
that its own pass would have computed, bit for bit. Not an amax per (layer set, calibrator):
that would be shared only by points that differ in their kernel. Which layers read one tensor
(the scale groups) depends on the recipe's layer set and is found by each study on its first
batch, as without the cache.

One entry per layer (`<root>/<key>/<layer>.pt`), keyed by everything that decides the fp32
inputs of that layer: the model and its weights digest (BatchNorm re-estimation for random
weights included: it runs on the same images), preprocessing, the calibration folder and image
IDs, the batch the images pass in, the device (GPU name) and torch version. A recipe with other
layers observes only the layers not stored yet, so a sweep's entries grow to the union of its
recipes' layers. Inputs divided by a migration are a plan's own and never shared.

Entries are written atomically (`record/io.py`); an entry that cannot be trusted (unreadable,
not the expected tensors, another key, a second moment missing where one is needed) is deleted
and observed again, saying so, as `StageCache` does. Two studies observing one layer at once
both write the same bytes. Opt-in: the folder is `$QUANTSTUDY_CALIB_STATS_DIR`, which
`quantstudy sweep` sets for its studies (`sweep/caches.py`); unset, a study calibrates alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantstudy.quant.calibration.calibrate import InputStats, observe
from quantstudy.quant.calibration.calibrators import BINS
from quantstudy.record.io import write_bytes_atomic
from quantstudy.study.cache import console, load_entry

STATS_ENV = "QUANTSTUDY_CALIB_STATS_DIR"
FORMAT = 1  # bump when InputStats or the observation changes meaning


@dataclass(frozen=True)
class SharedStats:
    """A `quant.calibration.calibrate.StatsSource` over a folder of per-layer entries under one
    key."""

    root: Path
    key: str

    @classmethod
    def keyed(cls, root: Path, parts: list[Any]) -> SharedStats:
        blob = json.dumps([FORMAT, *parts], sort_keys=True).encode()
        return cls(root, hashlib.sha256(blob).hexdigest())

    @property
    def folder(self) -> Path:
        return self.root / self.key[:24]

    def path(self, layer: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in layer)[:120]
        digest = hashlib.sha256(layer.encode()).hexdigest()[:8]
        return self.folder / f"{safe}-{digest}.pt"

    def __call__(
        self,
        model: nn.Module,
        layers: list[str],
        batches: Iterator[torch.Tensor],
        second_moments: list[str],
    ) -> tuple[dict[str, InputStats], int]:
        wanted = set(second_moments)
        found: dict[str, tuple[InputStats, int]] = {}
        for layer in layers:
            entry = self._read(layer, layer in wanted)
            if entry is not None:
                found[layer] = entry
        counts = {n for _, n in found.values()}
        if len(counts) > 1:  # entries of one key disagree: trust none of them
            console.print(f"[yellow]calibration statistics in {self.folder} disagree on the "
                          "image count; observing them again[/yellow]")  # fmt: skip
            found = {}
        missing = [layer for layer in layers if layer not in found]
        stats = {layer: s for layer, (s, _) in found.items()}
        n_images = next(iter(counts)) if found else 0
        if found:
            console.print(
                f"calibration statistics reused from {self.folder} ({len(found)} of "
                f"{len(layers)} layers)",
                soft_wrap=True,
            )
        if missing:
            fresh, n_images = observe(model, missing, batches, [n for n in missing if n in wanted])
            for layer, s in fresh.items():
                self._write(layer, s, n_images)
            stats.update(fresh)
            console.print(
                f"calibration statistics of {len(missing)} layers observed and stored in "
                f"{self.folder}",
                soft_wrap=True,
            )
        return stats, n_images

    def _write(self, layer: str, s: InputStats, n_images: int) -> None:
        entry = {
            "key": _text(self.key),
            "layer": _text(layer),
            "n_images": torch.tensor(n_images),
            "amax": torch.tensor(s.amax, dtype=torch.float64),
            "nonfinite": torch.tensor(s.nonfinite),
            "hist": s.hist,
            "channel_sum": s.channel_sum,
            "channel_amax": s.channel_amax,
            "count": torch.tensor(s.count),
        }
        if s.second_sum is not None:
            entry |= {"second_sum": s.second_sum, "second_count": torch.tensor(s.second_count)}
        buffer = io.BytesIO()
        torch.save(entry, buffer)
        write_bytes_atomic(self.path(layer), buffer.getvalue())

    def _read(self, layer: str, second: bool) -> tuple[InputStats, int] | None:
        """The stored entry of `layer`, or None: absent, or deleted (reason printed) when it
        cannot be trusted. An entry without the second moment asked for is observed again."""
        path = self.path(layer)
        if not path.exists():
            return None
        entry, why = load_entry(path)
        why = why or _invalid(entry, self.key, layer)
        if why:
            _discard(path, why)
            return None
        if second and "second_sum" not in entry:
            return None  # observed again, with the moment, and rewritten
        stats = InputStats(
            amax=float(entry["amax"]),
            nonfinite=int(entry["nonfinite"]),
            hist=entry["hist"],
            channel_sum=entry["channel_sum"],
            channel_amax=entry["channel_amax"],
            count=int(entry["count"]),
            second_sum=entry.get("second_sum"),
            second_count=int(entry["second_count"]) if "second_sum" in entry else 0,
        )
        return stats, int(entry["n_images"])


def shared_stats(parts: list[Any]) -> SharedStats | None:
    """The host's shared statistics for a calibration decided by `parts`, or None when
    `$QUANTSTUDY_CALIB_STATS_DIR` is unset."""
    root = os.environ.get(STATS_ENV)
    return SharedStats.keyed(Path(root), parts) if root else None


def _text(s: str) -> torch.Tensor:
    return torch.tensor(list(s.encode()), dtype=torch.uint8)


def _untext(t: Any) -> str | None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        return None
    return bytes(t.tolist()).decode(errors="replace")


def _scalar(entry: dict[str, Any], name: str, *, floating: bool = False) -> bool:
    t = entry.get(name)
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 0
        and t.is_floating_point() == floating
        and (floating or int(t) >= 0)
    )


def _invalid(entry: Any, key: str, layer: str) -> str | None:
    """Why `entry` is not a valid entry of `layer` under `key`, or None."""
    if not isinstance(entry, dict):
        return f"holds a {type(entry).__name__}, not a statistics entry"
    if _untext(entry.get("key")) != key or _untext(entry.get("layer")) != layer:
        return "an entry of another key or layer"
    if not all(_scalar(entry, n) for n in ("n_images", "nonfinite", "count")):
        return "missing its counts"
    if not _scalar(entry, "amax", floating=True) or int(entry["n_images"]) == 0:
        return "missing its amax or image count"
    hist, csum, camax = (entry.get(n) for n in ("hist", "channel_sum", "channel_amax"))
    if not (isinstance(hist, torch.Tensor) and hist.shape == (BINS,)):
        return "missing its histogram"
    if hist.dtype != torch.float64 or not bool(torch.isfinite(hist).all()):
        return "holding a damaged histogram"
    if not (isinstance(csum, torch.Tensor) and isinstance(camax, torch.Tensor)):
        return "missing its channel statistics"
    if csum.dim() != 1 or camax.shape != csum.shape or csum.dtype != torch.float64:
        return "holding damaged channel statistics"
    if "second_sum" in entry:
        s = entry["second_sum"]
        c = csum.shape[0]
        if not (
            isinstance(s, torch.Tensor) and s.shape == (c, c) and _scalar(entry, "second_count")
        ):
            return "holding a damaged second moment"
    return None


def _discard(path: Path, why: str) -> None:
    console.print(
        f"[yellow]calibration statistics {path} is {why}; observing it again[/yellow]",
        soft_wrap=True,
    )
    path.unlink(missing_ok=True)
