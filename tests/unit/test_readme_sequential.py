"""The README's `--heldout auto` example quotes its results JSON, not typed numbers.

docs/results/sequential/lite0-cpu-generic_pointwise.json is written from the study's sealed
record by tools/results/sequential_studies.py; each figure the README gives is formatted here
from that file and must appear in the README as written.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "sequential" / "lite0-cpu-generic_pointwise.json"


def _gate(stage: dict, name: str) -> dict:
    return next(g for g in stage["gates"] if g["gate"] == name)


def _points(x: float) -> str:
    return f"{100 * x:+.2f}"


def test_readme_quotes_the_sequential_results():
    study = json.loads(RESULTS.read_text())["studies"][0]
    readme = " ".join((ROOT / "README.md").read_text().split())
    run, extended = study["stages"]
    assert (run["images"], extended["images"]) == (1300, 1800)
    kl = _gate(run, "KL mean")
    assert kl["status"] == "fail"
    agreement, top1 = _gate(run, "top-1 agreement"), _gate(run, "top-1 change")
    agreement_after = _gate(extended, "top-1 agreement")
    top1_after = _gate(extended, "top-1 change")
    assert agreement_after["status"] == "fail" and top1_after["status"] == "inconclusive"
    quoted = [
        f"settled *fail* at {kl['settled_at']} images",
        f"({kl['estimate']:.3f} at 1300, 95% confidence sequence [{kl['lower']:.3f}, "
        f"{kl['upper']:.3f}]",
        f"agreement ({100 * agreement['estimate']:.1f}%, [{100 * agreement['lower']:.1f}%, "
        f"{100 * agreement['upper']:.1f}%])",
        f"({_points(top1['estimate'])} points, [{_points(top1['lower'])}, "
        f"{_points(top1['upper'])}])",
        f"settled agreement *fail* at {agreement_after['settled_at']} "
        f"({100 * agreement_after['estimate']:.1f}% at 1800)",
        f"({_points(top1_after['estimate'])} points, [{_points(top1_after['lower'])}, "
        f"{_points(top1_after['upper'])}] at 1800)",
    ]
    for text in quoted:
        assert text in readme, text
    assert study["outcome"] == "not_ship" and "FP8 is *not shipped*" in readme
