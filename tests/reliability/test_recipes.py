"""Class 5: every built-in recipe's study ends in a report that passes its own self-check.

A transformer under `generic_linears` fuses each block's residual add into the FP8 layers'
epilogue; the report counts those layers ("24 FP8 layers summed their block's residual ...,
none x24"), a count of a layer -> activation map the record holds. The self-check once allowed
list lengths only, so the study wrote study.json and then died at the report stage (and so did
`quantstudy report`) whenever that count did not happen to equal some other number of the
record. timm's `test_vit` has 6 blocks, 12 residual sums; with 6 of the workspace's 16 images
calibrating, 10 are held out, so only the record's creation time (a month, hour, minute or
second of 12) can hold another 12: `tests/unit/test_selfcheck_counts.py` checks the rule itself
on a record with no such coincidence.
"""

from __future__ import annotations

from tests.reliability._drive import assert_finished, quantstudy, study_args


def test_vit_with_generic_linears_reports(workspace, tmp_path):
    out = tmp_path / "vit"
    args = study_args(out, "--recipe", "generic_linears")
    args[args.index("--calib") + 1] = "6"
    args[args.index("test_efficientnet")] = "test_vit"
    r = quantstudy(*args, cwd=workspace)
    assert_finished(r)
    report = (out / "report.md").read_text()
    assert "12 FP8 layers summed their block's residual" in report
    (out / "report.md").unlink()
    again = quantstudy("report", str(out), cwd=workspace)
    assert again.code == 0, again.text[-3000:]
    assert (out / "report.md").read_text() == report
