"""The independent EfficientNet-Lite0 fp32 result (reference/lite0_fp32.py, no quantstudy code)
that the data tests pin quantstudy's fp32 numbers to, image by image."""

from __future__ import annotations

import json
from pathlib import Path

import torch

RECORD = Path(__file__).parent / "reference" / "lite0_fp32.json"
# Images on which quantstudy's fp32 prediction may differ from the reference: the two compute
# the same float32 network but sum in other orders (batch size, thread count, im2col vs direct),
# which moves a logit by a few float32 ulps and flips an image whose top two logits are that close.
FLIPS = 2


def reference() -> dict[str, list[int]]:
    """Every image of val-1300 as "wnid/file" -> [label, predicted class]."""
    return json.loads(RECORD.read_text())["predictions"]


def assert_matches_reference(ids: list[str], labels: torch.Tensor, logits: torch.Tensor) -> None:
    """quantstudy's labels equal the reference's and its fp32 predictions differ on at most
    `FLIPS` of these images, so its top-1 is the reference's within FLIPS images."""
    ref = reference()
    assert labels.tolist() == [ref[i][0] for i in ids], "labels differ from classes.txt order"
    predicted = logits.argmax(1).tolist()
    differ = [i for i, p in zip(ids, predicted, strict=True) if p != ref[i][1]]
    ours = sum(p == ref[i][0] for i, p in zip(ids, predicted, strict=True))
    theirs = sum(ref[i][0] == ref[i][1] for i in ids)
    print(f"fp32 top-1 on {len(ids)} images: {ours} correct, reference {theirs}; "
          f"{len(differ)} predictions differ")  # fmt: skip
    assert len(differ) <= FLIPS, differ[:10]
