"""Class 6: the fp32 reference is checked before any engine is judged against it. A defect of
the model itself (NaN/Inf logits, the same logits for every image) is refused in one line,
never reported as an FP8 loss; the reference's logits stay cached for the rerun."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.reliability._drive import MODEL, assert_one_line_error, quantstudy, study_args


def _checkpoint(path, classifier_weight: float):
    """timm's tiny model with every classifier weight set to `classifier_weight`: NaN makes
    every logit NaN; 0 makes every image's logits the classifier's bias."""
    import timm

    state = timm.create_model(MODEL).state_dict()
    state["classifier.weight"] = torch.full_like(state["classifier.weight"], classifier_weight)
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize(
    ("weight", "needle"),
    [(math.nan, "NaN/Inf logits on 10 of 10"), (0.0, "the same logits for all 10")],
    ids=["nan", "constant"],
)
def test_a_broken_reference_is_refused_not_scored(workspace, tmp_path, weight, needle):
    args = study_args(tmp_path / "study", "--calib", "6")
    args[args.index("random")] = _checkpoint(tmp_path / "w.pth", weight)
    r = quantstudy(*args, cwd=workspace)
    assert_one_line_error(r, "fp32 reference", needle, "--weights")
    record = json.loads((tmp_path / "study" / "study.json").read_text())
    assert record["status"] == "partial" and record.get("quality") is None
    cache = tmp_path / "study" / ".cache"
    # the engines' stress passes finished before the held-out pass and stay for a rerun; the
    # reference is refused at its first held-out chunk, before any row is scored or cached
    assert list(cache.glob("stress-fp32-*.pt")) and not list(cache.glob("rows-*.pt"))
