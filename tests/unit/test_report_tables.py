"""The declared report tables (`report/sections/tables.py`): rendered as declared, checked."""

from pathlib import Path

from quantstudy.record import StudyRecord
from quantstudy.report.markdown import render_markdown
from quantstudy.report.sections.results import TABLE_SPECS
from quantstudy.report.selfcheck import check_markdown

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [
    *sorted((ROOT / "examples").glob("**/study.json")),
    # the verifying study of a search (its variants, sensitivity, layer speed and choice tables),
    # as `quantstudy search` wrote it; no committed example is a search
    ROOT / "tests/fixtures/search_study_example.json",
    ROOT / "tests/fixtures/study_example.json",
]


def _headers(md: str) -> list[str]:
    lines = md.split("\n")
    return [
        line
        for i, line in enumerate(lines)
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("| ---")
    ]


def _records() -> list[StudyRecord]:
    records = [StudyRecord.model_validate_json(p.read_text()) for p in RECORDS]
    fixture = records[-1]  # with compiled packages too, which no example built
    speed = fixture.speed.model_copy(update={"package_bytes": {"fp16": 1000, "fp8": 600}})
    return [*records, fixture.model_copy(update={"speed": speed})]


# tables of sections every complete study or search has (others, e.g. the FP8 roofline limit,
# need data the committed examples do not hold)
ALWAYS = {
    "speed per batch",
    "weight bytes",
    "compiled package bytes",
    "quality per engine",
    "emulation gap",
    "NaN/Inf scan",
    "kernel time per group",
    "largest kernels",
    "recipe variants",
    "per-layer sensitivity",
    "per-layer speed",
    "prediction and measurement",
    "layer choice",
}


def test_tables_are_rendered_from_their_specs():
    rendered = set()
    for record in _records():
        rendered.update(_headers(render_markdown(record)))
    specs = {s.name: s for s in TABLE_SPECS}
    assert ALWAYS <= set(specs)
    for name in ALWAYS:
        shown = {"| " + " | ".join(h) + " |" for h in specs[name].variants()}
        assert shown & rendered, f"no example renders the {name} table"


def test_declared_headers_name_one_table_each():
    headers = [tuple(h) for s in TABLE_SPECS for h in s.variants()]
    assert len(headers) == len(set(headers))
    assert len({s.name for s in TABLE_SPECS}) == len(TABLE_SPECS)


def test_a_row_short_of_its_declared_cells_is_a_problem():
    path = ROOT / "tests/fixtures/study_example.json"
    record = StudyRecord.model_validate_json(path.read_text())
    md = render_markdown(record)
    lines = md.split("\n")
    header = next(i for i, x in enumerate(lines) if x.startswith("| Engine | Top-1 | Top-5"))
    lines[header + 2] = lines[header + 2].rsplit(" | ", 1)[0] + " |"  # drop the last cell
    problems = check_markdown("\n".join(lines), record)
    assert any(
        "row of the quality per engine table has 13 cells, header has 14" in p for p in problems
    )
