"""Every exactness claim of the README and docs/ names the test that asserts it.

A sentence that says two computations agree "bit for bit" (or "bit-identical", "bit-exactly",
"the same bits", "the same bytes") or "one FP8 step" apart is a claim a test must assert at that
strength: `torch.equal` or equal bytes, the E4M3 step computed from the value's exponent
(tests/fp8_steps.py). So each such sentence names its test as `tests/<path>.py::<test>` (written
`(test: tests/gpu/test_x.py::test_y)` or inline), and this check holds every name to the tree:
the file exists and defines that test. A negative claim ("not bit for bit") names the test that
shows the difference (a strict xfail of the withdrawn claim, or a record's test).

A sentence is what a reader takes as one: within a paragraph or list item (Markdown lines
joined), the text up to a full stop followed by a capital, a backtick or a bracket; a table row
is one, read with its table's caption (the sentence before the table), which may name the test
of every row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLAIM = re.compile(
    r"bit[ -]for[ -]bit|bit-identical|bit-exact|same bits|same bytes|one (?:FP8 |E4M3 )?step"
    r"|a step from",
    re.IGNORECASE,
)
TEST_NAME = re.compile(r"tests/[\w/.-]+\.py::(test_\w+)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\[*])")


def docs() -> list[Path]:
    """The README and the design notes of docs/ (docs/results/ holds rendered records)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows, each on one line; code fences left out. A table row
    carries its table's caption (the sentence before the table), where its test may be named
    once for every row."""
    out: list[str] = []
    current: list[str] = []
    caption = ""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        stripped = line.strip()
        starts_item = re.match(r"([-*]|\d+\.) ", stripped) is not None
        if fenced or not stripped or stripped.startswith(("|", "#")) or starts_item:
            if current:
                out.append(" ".join(current))
                caption = _SENTENCE_END.split(out[-1])[-1]
            current = []
            if fenced:
                continue
            if stripped.startswith("|"):
                out.append(f"{stripped} [table: {caption}]")
            elif stripped.startswith("#"):
                caption = ""
            elif starts_item:
                current = [stripped]
            continue
        current.append(stripped)
    if current:
        out.append(" ".join(current))
    return out


def sentences(text: str) -> list[str]:
    """The sentences of each block (a table row, with its caption, is one)."""
    return [
        s
        for block in blocks(text)
        for s in ([block] if block.startswith("|") else _SENTENCE_END.split(block))
    ]


def claims(text: str) -> list[str]:
    """The sentences of `text` that make an exactness claim."""
    return [s for s in sentences(text) if CLAIM.search(s)]


def unbacked(sentence: str, repo: Path = REPO) -> list[str]:
    """What is wrong with a claim sentence's test names: none named, a file missing, a test that
    its file does not define (empty: every name holds)."""
    named = re.findall(r"tests/[\w/.-]+\.py::test_\w+", sentence)
    if not named:
        return ["names no test (add `(test: tests/<path>.py::<test>)`)"]
    wrong = []
    for name in named:
        file, test = name.split("::")
        path = repo / file
        if not path.is_file():
            wrong.append(f"{file} does not exist")
        elif not re.search(rf"^\s*(?:async )?def {test}\(", path.read_text(), re.MULTILINE):
            wrong.append(f"{file} defines no {test}")
    return wrong


def test_every_exactness_claim_names_a_test_that_exists():
    found = {}
    for doc in docs():
        for sentence in claims(doc.read_text(encoding="utf-8")):
            if problems := unbacked(sentence):
                found.setdefault(str(doc.relative_to(REPO)), []).append(
                    f"{sentence[:160]}...: {'; '.join(problems)}"
                )
    assert not found, "exactness claims without their test:\n" + "\n".join(
        f"  {doc}: {line}" for doc, lines in found.items() for line in lines
    )


def test_the_docs_make_claims_and_the_readme_among_them():
    """The check reads something: the README's package claim and the kernel note's are found."""
    readme = claims((REPO / "README.md").read_text())
    kernel = claims((REPO / "docs" / "fp8-kernel.md").read_text())
    assert any("bit for bit at batches 1 and 128" in s for s in readme)
    assert len(kernel) >= 5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("The two engines agree bit for bit.", "names no test"),
        ("They write the same bits (tests/unit/test_nope.py::test_x).", "does not exist"),
        (
            "They are one FP8 step apart (test: tests/unit/test_claims_named.py::test_gone).",
            "defines no test_gone",
        ),
    ],
)
def test_a_claim_without_its_test_is_caught(text, problem):
    """The check can fail: an unnamed test, a missing file and a missing function are each
    reported."""
    (sentence,) = claims(text)
    assert any(problem in p for p in unbacked(sentence))


def test_a_table_row_is_backed_by_its_own_test_or_its_tables_caption():
    named = "tests/unit/test_claims_named.py::test_a_claim_without_its_test_is_caught"
    captioned = f"The records (test: {named}):\n\n| a | b |\n| --- | --- |\n| x | bit for bit |\n"
    (row,) = claims(captioned)
    assert unbacked(row) == []
    bare = "The records:\n\n| a | b |\n| --- | --- |\n| x | bit for bit |\n"
    (row,) = claims(bare)
    assert unbacked(row) != []


def test_a_claim_with_its_test_passes_and_other_sentences_are_no_claims():
    text = (
        "Tables render the same way. The padded store writes the same bytes as the plain one "
        "(test: tests/unit/test_claims_named.py::test_a_claim_without_its_test_is_caught). "
        "A step further on."
    )
    (sentence,) = claims(text)
    assert unbacked(sentence) == []
