"""The README's GPU suite and package figures quote their committed records, not typed numbers.

tests/gpu/records/gpu-suite.json is what tools/gpu_suite.py wrote on the GPU machine;
docs/results/package/diagnose-lite0.json is what tools/lab/gpu/package_diagnose.py wrote there.
Each figure the README gives about them is formatted here from those files and must appear in
the README as written, so a new record with other numbers fails until the prose follows it.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/gpu/records/gpu-suite.json"
PACKAGE = "docs/results/package/package-bench-lite0.json"

pytestmark = pytest.mark.committed("README.md", SUITE, PACKAGE)


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())


def test_readme_quotes_the_gpu_suite_record():
    record = json.loads((ROOT / SUITE).read_text())
    readme = _readme()
    green = record["failed"] + record["errors"] == 0 and record["complete"]
    assert f"at {record['commit'][:7]}," in readme, "the README names the record's commit"
    assert green, "the README calls the committed record green"
    versions = record["versions"]
    quoted = [
        "is green",
        f"{record['tests']:,} tests, {record['passed']:,} passed, {record['failed']} failed",
        f"Its {record['skipped']} skips",
        f"torch {versions['torch']}",
        f"Triton {versions['triton']}",
        f"numpy {versions['numpy']}",
        f"onnxruntime {versions['onnxruntime']}",
    ]
    for text in quoted:
        assert " ".join(text.split()) in readme, text
    # the skips the README names add up to the record's, reason by reason
    skips: dict[str, int] = {}
    for group in record["groups"]:
        for reason, count in group["skips"].items():
            skips[reason] = skips.get(reason, 0) + count
    by_kind = {
        "strict xfails": sum(n for r, n in skips.items() if r.startswith("measured on the H200")),
        "row-wise CPU": skips["this torch's CPU torch._scaled_mm takes per-tensor scales only"],
        "calib-1000": sum(n for r, n in skips.items() if "calib-1000 absent" in r),
        "CPU-package": sum(n for r, n in skips.items() if "cannot package the CPU" in r),
        "fp16 Q/DQ": sum(n for r, n in skips.items() if "onnxruntime>=1.32" in r),
        "Ray": sum(n for r, n in skips.items() if "'ray'" in r),
    }
    by_kind["refusals"] = record["skipped"] - sum(by_kind.values())
    quoted_counts = {
        "strict xfails": f"{by_kind['strict xfails']} strict xfails",
        "row-wise CPU": f"{by_kind['row-wise CPU']} tests of row-wise CPU",
        "calib-1000": f"{by_kind['calib-1000']} data tests that read `calib-1000`",
        "CPU-package": f"{by_kind['CPU-package']} CPU-package tests",
        "fp16 Q/DQ": f"{by_kind['fp16 Q/DQ']} fp16 Q/DQ test",
        "Ray": f"{by_kind['Ray']} Ray test",
        "refusals": f"{by_kind['refusals']} that check refusals",
    }
    for text in quoted_counts.values():
        assert text in readme, text


def test_readme_quotes_the_lite0_package_record():
    """The check's figures as the README gives them, from the package-bench record."""
    record = json.loads((ROOT / PACKAGE).read_text())
    readme = _readme()
    assert record["model"] == "lite0" and record["check"]["passed"]
    assert record["check"]["agreement"]["differ_count"] == 0  # "bit for bit"
    assert record["check"]["agreement"]["max_abs_logit_diff"] == 0.0
    speed = {r["batch"]: r for r in record["speed"]}
    for batch in (128, 1):
        r = speed[batch]
        share = f"{r['packaged_x'] / r['study_x']:.1%}"
        pair = f"{r['packaged_x']:.3f} against {r['study_x']:.3f}"
        assert share in readme and pair in readme, (batch, share, pair)
    assert "H100" in record["provenance"]["gpu"] and "an H100" in readme
