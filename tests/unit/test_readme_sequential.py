"""The README's `--heldout auto` examples quote their results JSON, not typed numbers.

docs/results/sequential/lite0-cpu-{generic_pointwise,generic_pointwise_sequential}.json are
written from the studies' sealed records by tools/lab/results/sequential_studies.py; each figure the
README gives is formatted here from those files and must appear in the README as written.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "sequential" / "lite0-cpu-generic_pointwise.json"
SEQUENTIAL = RESULTS.with_name("lite0-cpu-generic_pointwise_sequential.json")


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


def _interval(gate: dict, digits: int = 1) -> str:
    return f"[{100 * gate['lower']:.{digits}f}%, {100 * gate['upper']:.{digits}f}%]"


def test_readme_quotes_the_sequential_recipes_results():
    study = json.loads(SEQUENTIAL.read_text())["studies"][0]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert study["recipe"] == "generic_pointwise_sequential"
    run, extended = study["stages"]
    assert (run["images"], extended["images"]) == (1300, 1800)
    kl = _gate(run, "KL mean")
    assert kl["status"] == "pass" and _gate(extended, "KL mean")["status"] == "pass"
    agreement, top1 = _gate(run, "top-1 agreement"), _gate(run, "top-1 change")
    agreement_after, top1_after = (
        _gate(extended, "top-1 agreement"),
        _gate(extended, "top-1 change"),
    )
    for gate in (agreement, top1, agreement_after, top1_after):
        assert gate["status"] == "inconclusive", gate
    quoted = [
        f"settled *pass* at {kl['settled_at']} images ({kl['estimate']:.4f} at 1300, "
        f"[{kl['lower']:.4f}, {kl['upper']:.4f}])",
        f"agreement ({100 * agreement['estimate']:.1f}%, {_interval(agreement)})",
        f"({_points(top1['estimate'])} points, [{_points(top1['lower'])}, "
        f"{_points(top1['upper'])}]) were open",
        f"({100 * agreement_after['estimate']:.1f}%, {_interval(agreement_after)} and "
        f"{_points(top1_after['estimate'])} points, [{_points(top1_after['lower'])}, "
        f"{_points(top1_after['upper'])}] at 1800)",
    ]
    for text in quoted:
        assert text in readme, text
    assert study["outcome"] == "inconclusive"
