"""The GPU suite and package figures of the README and docs quote their committed records, not
typed numbers.

tests/gpu/records/gpu-suite.json is what tools/gpu_suite.py wrote on the GPU machine;
docs/results/package/package-bench-*.json are what tools/lab/gpu/package_bench.py wrote there.
Each figure the README, docs/VERSIONS.md (the suite) and docs/package.md (xception41) give about
them is formatted here
from those files and must appear as written, so a new record with other numbers fails until the
prose follows it.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/gpu/records/gpu-suite.json"
PACKAGE = "docs/results/package/package-bench-lite0.json"
XCEPTION = "docs/results/package/package-bench-xception41.json"
PACKAGE_DOC = "docs/package.md"
SUITE_DOC = "docs/VERSIONS.md"

pytestmark = pytest.mark.committed("README.md", SUITE, PACKAGE, XCEPTION, PACKAGE_DOC, SUITE_DOC)


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())


def test_the_versions_page_quotes_the_gpu_suite_record():
    record = json.loads((ROOT / SUITE).read_text())
    page = " ".join((ROOT / SUITE_DOC).read_text().split())  # the README points to it
    green = record["failed"] + record["errors"] == 0 and record["complete"]
    assert f"at {record['commit'][:7]}," in page, "the page names the record's commit"
    assert green, "the page calls the committed record green"
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
        assert " ".join(text.split()) in page, text
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
        "interpreted": sum(n for r, n in skips.items() if "interpreted kernel in wrap_triton" in r),
    }
    by_kind["refusals"] = record["skipped"] - sum(by_kind.values())
    quoted_counts = {
        "strict xfails": f"{by_kind['strict xfails']} strict xfails",
        "row-wise CPU": f"{by_kind['row-wise CPU']} tests of row-wise CPU",
        "calib-1000": (
            f"{by_kind['calib-1000']} data tests that read `calib-1000`"
            if by_kind["calib-1000"]
            else "no data test skipped for want of images"
        ),
        "CPU-package": f"{by_kind['CPU-package']} CPU-package tests",
        "fp16 Q/DQ": f"{by_kind['fp16 Q/DQ']} fp16 Q/DQ test",
        "Ray": f"{by_kind['Ray']} Ray test",
        "interpreted": f"{by_kind['interpreted']} interpreted-kernel replay test",
        "refusals": f"{by_kind['refusals']} that check refusals",
    }
    for text in quoted_counts.values():
        assert text in page, text


def test_readme_quotes_the_lite0_package_record():
    """The check's figures as the README gives them, from the package-bench record."""
    record = json.loads((ROOT / PACKAGE).read_text())
    readme = _readme()
    assert record["model"] == "lite0" and record["check"]["passed"]
    # "bit for bit at batches 1 and 128": each package's largest logit difference, not the
    # aggregate of the worst one
    each = record["check"]["per_package"]
    assert set(each) == {"fp8-b1.pt2", "fp8-b128.pt2"}, set(each)
    for file, found in each.items():
        assert found["max_abs_logit_diff"] == 0.0 and found["differ_count"] == 0, file
    assert "bit for bit at batches 1 and 128" in readme
    speed = {r["batch"]: r for r in record["speed"]}
    for batch in (128, 1):
        r = speed[batch]
        share = f"{r['packaged_x'] / r['study_x']:.1%}"
        pair = f"{r['packaged_x']:.3f} against {r['study_x']:.3f}"
        assert share in readme and pair in readme, (batch, share, pair)
    assert "H100" in record["provenance"]["gpu"] and "an H100" in readme


def _section(doc: str, heading: str) -> str:
    """The text under `heading` up to the next heading, whitespace folded as in _readme."""
    text = (ROOT / doc).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return " ".join(text[start : end if end >= 0 else None].split())


def test_package_doc_quotes_the_xception41_record():
    """package.md's xception41 table and paragraph, formatted from the package-bench record."""
    record = json.loads((ROOT / XCEPTION).read_text())
    doc = _section(PACKAGE_DOC, "## The check on the H100: xception41")
    check = record["check"]
    assert record["model"] == "xception41" and check["passed"]
    assert "--weights random" in record["study"]["command"], "the doc says random weights"
    b1, b128 = (check["per_package"][f"fp8-b{b}.pt2"] for b in (1, 128))
    assert b128["differ_count"] == 0 and b128["max_abs_logit_diff"] == 0.0  # "bit for bit"
    assert b1["max_abs_logit_diff"] > 0, "the doc says batch 1 is not bit-identical"
    speed = {r["batch"]: r for r in record["speed"]}
    s1, s128 = speed[1], speed[128]

    def packaged(r: dict) -> str:
        q1, q3 = r["packaged_x_q1_q3"]
        return f"{r['packaged_x']:.3f} [{q1:.3f}-{q3:.3f}]"

    def ms(r: dict, who: str, digits: int) -> str:
        return f"{r[who + '_fp16_ms']:.{digits}f} / {r[who + '_fp8_ms']:.{digits}f}"

    rows = [
        f"| packaged FP8 logits against the study's FP8 engine | {b1['differ_count']} of "
        f"{b1['n_images']} top-1 differ, KL mean {b1['kl_mean']:.3g}, max \\|logit diff\\| "
        f"{b1['max_abs_logit_diff']:.3g} | bit for bit, {b128['n_images']} of {b128['n_images']} |",
        f"| x, the study's engines | {s1['study_x']:.3f} | {s128['study_x']:.3f} |",
        f"| x, the packages (CUDA graph replays, the study's harness method) | {packaged(s1)} | "
        f"{packaged(s128)} |",
        f"| packaged fp16 / FP8 ms | {ms(s1, 'packaged', 4)} | {ms(s128, 'packaged', 2)} |",
        f"| the study's fp16 / FP8 ms | {ms(s1, 'study', 4)} | {ms(s128, 'study', 2)} |",
    ]
    # the floor as the check wrote it: here, the gate's limits, and the study's own
    detail = next(f["detail"] for f in check["findings"] if "fp8-b1.pt2" in f["name"])
    limit = re.search(r"at most (\d+) differ and KL mean <= ([\d.e-]+)\)", detail)
    study_floor = re.search(r"study's floor \([^)]*\): agreement [\d.]+ \((\d+) differ\), "
                            r"KL mean ([\d.e-]+)", detail)  # fmt: skip
    assert limit and study_floor, detail
    slower = {e: s128[f"packaged_{e}_ms"] / s128[f"study_{e}_ms"] - 1 for e in ("fp8", "fp16")}
    assert slower["fp8"] > slower["fp16"] > 0, "the doc says both slower, the FP8 one more"
    assert all(r["within_5pct_or_better"] for r in record["speed"])
    first_load = next(iter(check["load_s"].values()))
    quoted = [
        *rows,
        f"at {record['provenance']['commit'][:7]} on an H100",
        f"0 of {b128['n_images']} differ",
        f"KL mean {b1['kl_mean']:.3g}, KL max {b1['kl_max']:.3g}, max |logit diff| "
        f"{b1['max_abs_logit_diff']:.3g}",
        f"moves {check['floor']['differ_count']} of {check['n_images']} top-1s here (KL mean "
        f"{check['floor']['kl_mean']:.3g})",
        f"at most {limit[1]} differing and a KL mean of at most {limit[2]}",
        f"floor on this H100: {study_floor[1]} differ, KL mean {study_floor[2]}",
        f"{s1['packaged_x'] / s1['study_x']:.1%} of the study's at batch 1 and "
        f"{s128['packaged_x'] / s128['study_x']:.1%} at batch 128",
        f"({slower['fp8']:.1%} against {slower['fp16']:.1%})",
        f"`tma_replaced` is {record['tma_replaced']} of {record['tiles']} tiles",
        f"The study took {record['study']['wall_s']:.0f} s, packaging "
        f"{record['package_s']:.0f} s ({record['compile_s']:.0f} s of it AOTInductor's compile), "
        f"the check {record['check_s']:.0f} s, the first package's load {first_load:.0f} s",
    ]
    for text in quoted:
        assert text in doc, text
    assert "H100" in record["provenance"]["gpu"]
    readme = _readme()
    assert "xception41's packages (random weights) passed" in readme
    assert "bit for bit at batch 128, inside the check's floor but not bit for bit at batch 1" in (
        readme
    )


PEERS = "docs/results/peers-h100-760cbc9-vit-fast.json"


@pytest.mark.committed(PEERS)
def test_readme_quotes_the_peers_record():
    """The README's table against torchao is the record's short table (`bench/peers/summary.py`:
    each engine's median x at batches 1 and 128, torchao's best, our lead), line for line, and
    names the commit that measured it."""
    from quantstudy.bench.peers.summary import summary_table
    from quantstudy.bench.schema import PeersBench, read_record

    record = read_record(ROOT / PEERS)
    assert isinstance(record, PeersBench)
    readme = (ROOT / "README.md").read_text()
    for line in summary_table(record):
        assert line in readme, line
    commits = {r.git_commit or record.provenance.git_commit for r in record.results}
    assert all(c and f"at {c[:7]}," in _readme() for c in commits), commits


DIAGNOSE = "docs/results/package/diagnose-lite0.json"


@pytest.mark.committed(PACKAGE_DOC, PACKAGE, DIAGNOSE)
def test_package_doc_quotes_the_lite0_records_bit_for_bit():
    """package.md's two Lite0 tables say "bit for bit, 200 of 200" at both batches: the H100
    check's largest logit difference is 0 for each package, and the H200 diagnosis found the
    package's logits bitwise equal to the study's FP8 engine's at batches 128 and 1."""
    check = json.loads((ROOT / PACKAGE).read_text())["check"]
    for file, found in check["per_package"].items():
        assert found["max_abs_logit_diff"] == 0.0 and found["differ_count"] == 0, file
    diagnosis = json.loads((ROOT / DIAGNOSE).read_text())
    for batch in ("128", "1"):
        stage = diagnosis["batches"][batch]["stages"]["package default"]
        assert stage["bitwise_equal"] and stage["max_abs_logit_diff"] == 0.0, batch
    row = "bit for bit, 200 of 200 | bit for bit, 200 of 200 |"
    for heading in ("## Measured on the H200: where", "## The check on the H100: Lite0"):
        assert row in _section(PACKAGE_DOC, heading), heading
