"""Per-image scores of the held-out pass: everything the quality section needs, nothing more.
Its "rows" are the logits' rows, one per image.

A study's quality figures are functions of a few values per image, not of the (images x classes)
logits: each engine's top-1 class, whether its row is finite and whether the label is among its
top 5; and for each compared pair (P, Q), KL(P || Q) and the largest logit difference. Keeping
only these lets a study stream its held-out images through every engine chunk by chunk (memory
does not grow with the number of classes, nor with the number of engines' logits), and resume
from the chunks already done: `RowSet.concat` of the chunks' rows equals `RowSet.of` the whole
logits, value for value, because every value is computed row by row.

Non-finite rows follow `metrics.py`: a pair's KL and logit difference are defined only on rows
finite in both (`PairRows.finite`); elsewhere they hold NaN and are never read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from quantstudy.quality.nonfinite import finite_rows

TOP5 = 5


def kl_per_image(p_logits: torch.Tensor, q_logits: torch.Tensor) -> np.ndarray:
    """KL(P || Q) in nats for each row, from log_softmax in float64.

    Rows must be finite. Rounding can leave a true zero a few ulps below 0; it is clamped to 0.
    """
    log_p = torch.log_softmax(p_logits.double(), dim=1)
    log_q = torch.log_softmax(q_logits.double(), dim=1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=1)
    return kl.clamp_min(0.0).cpu().numpy()


def topk_correct(logits: torch.Tensor, labels: np.ndarray, k: int) -> np.ndarray:
    """Per image: the label is among the k largest logits of a finite row (k capped at C)."""
    k = min(k, logits.shape[1])
    top = logits.topk(k, dim=1).indices.cpu().numpy()
    return finite_rows(logits) & (top == labels[:, None]).any(axis=1)


@dataclass(frozen=True)
class Predictions:
    """Per image of one engine: top-1 class, finite row, and (labelled) label in the top 5."""

    top1: np.ndarray
    valid: np.ndarray
    top5: np.ndarray | None = None

    @classmethod
    def of(cls, logits: torch.Tensor, labels: np.ndarray | None = None) -> Predictions:
        top5 = None if labels is None else topk_correct(logits, labels, TOP5)
        return cls(top1=logits.argmax(dim=1).cpu().numpy(), valid=finite_rows(logits), top5=top5)

    @classmethod
    def concat(cls, parts: Iterable[Predictions]) -> Predictions:
        parts = list(parts)
        top5 = None if parts[0].top5 is None else np.concatenate([p.top5 for p in parts])
        return cls(
            top1=np.concatenate([p.top1 for p in parts]),
            valid=np.concatenate([p.valid for p in parts]),
            top5=top5,
        )

    def agrees_with(self, other: Predictions) -> np.ndarray:
        """Per image: both predictions valid and the same class."""
        return self.valid & other.valid & (self.top1 == other.top1)

    def correct(self, labels: np.ndarray) -> np.ndarray:
        return self.valid & (self.top1 == labels)


@dataclass(frozen=True)
class PairRows:
    """Per image of a pair (P, Q): rows finite in both, KL(P || Q), max |P - Q| (NaN elsewhere)."""

    finite: np.ndarray
    kl: np.ndarray
    maxdiff: np.ndarray

    @classmethod
    def of(cls, p_logits: torch.Tensor, q_logits: torch.Tensor) -> PairRows:
        finite = finite_rows(p_logits) & finite_rows(q_logits)
        kl = np.full(finite.shape, np.nan)
        maxdiff = np.full(finite.shape, np.nan)
        mask = torch.from_numpy(finite)
        p, q = p_logits[mask], q_logits[mask]
        kl[finite] = kl_per_image(p, q)
        if p.numel():
            maxdiff[finite] = (p.double() - q.double()).abs().amax(dim=1).cpu().numpy()
        return cls(finite=finite, kl=kl, maxdiff=maxdiff)

    @classmethod
    def concat(cls, parts: Iterable[PairRows]) -> PairRows:
        parts = list(parts)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PAIR_FIELDS))

    @property
    def finite_kl(self) -> np.ndarray:
        """KL of the rows finite in both, in image order."""
        return self.kl[self.finite]

    @property
    def max_abs_logit_diff(self) -> float:
        """Largest absolute logit difference over the rows finite in both (0.0 when none)."""
        values = self.maxdiff[self.finite]
        return float(values.max()) if values.size else 0.0


_PAIR_FIELDS = ("finite", "kl", "maxdiff")
_ENGINE_FIELDS = ("top1", "valid", "top5")
Pair = tuple[str, str]


@dataclass(frozen=True)
class RowSet:
    """Per-image rows of several engines and pairs over the same images (same order)."""

    engines: dict[str, Predictions]
    pairs: dict[Pair, PairRows]

    @classmethod
    def of(
        cls, logits: dict[str, torch.Tensor], pairs: Iterable[Pair], labels: np.ndarray | None
    ) -> RowSet:
        """The rows of `logits` (engine -> (N, C)), pairs named (reference, engine)."""
        return cls(
            engines={n: Predictions.of(t, labels) for n, t in logits.items()},
            pairs={(p, q): PairRows.of(logits[p], logits[q]) for p, q in pairs},
        )

    @classmethod
    def concat(cls, parts: Iterable[RowSet]) -> RowSet:
        """The rows of consecutive image chunks, as one set."""
        parts = list(parts)
        if not parts:
            raise ValueError("no rows to join")
        first = parts[0]
        return cls(
            engines={n: Predictions.concat(p.engines[n] for p in parts) for n in first.engines},
            pairs={k: PairRows.concat(p.pairs[k] for p in parts) for k in first.pairs},
        )

    @property
    def n_images(self) -> int:
        return len(next(iter(self.engines.values())).top1)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor form (for `torch.save` with `weights_only` loading)."""
        out: dict[str, torch.Tensor] = {}
        for name, e in self.engines.items():
            for f in _ENGINE_FIELDS:
                value = getattr(e, f)
                if value is not None:
                    out[f"engine/{name}/{f}"] = torch.from_numpy(np.ascontiguousarray(value))
        for (p, q), rows in self.pairs.items():
            for f in _PAIR_FIELDS:
                out[f"pair/{p}/{q}/{f}"] = torch.from_numpy(getattr(rows, f))
        return out

    @classmethod
    def from_tensors(cls, data: dict[str, torch.Tensor]) -> RowSet:
        """The inverse of `to_tensors`."""
        engines: dict[str, dict[str, np.ndarray]] = {}
        pairs: dict[Pair, dict[str, np.ndarray]] = {}
        for key, t in data.items():
            kind, *names, field = key.split("/")
            if kind == "engine":
                engines.setdefault(names[0], {})[field] = t.numpy()
            else:
                pairs.setdefault((names[0], names[1]), {})[field] = t.numpy()
        return cls(
            engines={
                n: Predictions(f["top1"], f["valid"], f.get("top5")) for n, f in engines.items()
            },
            pairs={k: PairRows(**f) for k, f in pairs.items()},
        )
