"""A zoo row goes stale when what the engine code computes changes, not its bytes
(`study/sources.py`, `record/code_digest.py`): on a copy of the covered sources, a docstring or
comment edit keeps a row fresh, a changed constant in a kernel makes it stale; a row hashed by
bytes, before, reads stale with that reason; a study folder's marker says how it was hashed."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from quantstudy.record.code_digest import file_form, python_form
from quantstudy.study.sources import ENGINE_SOURCES, HASHED_BY, PACKAGE, engine_sources_sha256
from quantstudy.zoo.board import ZooRow
from quantstudy.zoo.row_files import ROW_ENVIRONMENT, Current, read_rows, stale_reasons
from quantstudy.zoo.sources import MARKER, read_marker, write_marker

ROWS = Path(__file__).resolve().parents[2] / "docs" / "results" / "zoo"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package's covered sources, to edit."""
    for part in ENGINE_SOURCES:
        shutil.copytree(PACKAGE / part, tmp_path / part, ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old  # the edit lands where meant: the source still holds it
    path.write_text(text.replace(old, new))


def _row(sources: str) -> tuple[ZooRow, Current]:
    """A committed row stamped with `sources` by this tree's hash, and a run like its own."""
    row = read_rows(ROWS)["resnet50"]
    assert row.measured is not None
    measured = row.measured.model_copy(
        update={"engine_sources": sources, "sources_hashed": HASHED_BY}
    )
    env = {k: measured.environment.get(k) for k in ROW_ENVIRONMENT}
    return row.model_copy(update={"measured": measured}), Current(sources, env)


def test_a_docstring_or_comment_edit_keeps_a_row_fresh_a_kernel_constant_stales_it(tree):
    before = engine_sources_sha256(tree)
    assert before == engine_sources_sha256()  # the copy hashes as the package does
    row, current = _row(before)
    settings = row.measured.settings if row.measured else {}
    assert stale_reasons(row, settings, current) == []
    kernel = tree / "quant" / "kernels" / "depthwise.py"
    text = kernel.read_text()
    assert text.startswith('"""')
    kernel.write_text(text.replace('"""', '"""Reworded. ', 1))  # the module's docstring
    _edit(kernel, "\ndef depthwise_conv(", "\n# a comment\ndef depthwise_conv(")
    conv = tree / "quant" / "kernels" / "conv.py"
    _edit(conv, '"""Output size of a zero-padded', '"""Size of a zero-padded')  # a function's
    recipes = next((tree / "recipe" / "builtin").glob("*.yaml"))
    recipes.write_text("# a comment on the recipe\n" + recipes.read_text())
    edited = engine_sources_sha256(tree)
    assert edited == before
    assert stale_reasons(row, settings, replace(current, engine_sources=edited)) == []
    _edit(kernel, 'FLOORS = {"BLOCK_P": 16,', 'FLOORS = {"BLOCK_P": 32,')  # what it computes
    changed = engine_sources_sha256(tree)
    assert changed != before
    reasons = stale_reasons(row, settings, replace(current, engine_sources=changed))
    assert reasons == [f"engine sources changed ({before[:12]} measured)"]


def test_a_row_hashed_by_bytes_reads_stale_with_that_reason():
    """The committed rows of before say no `sources_hashed`: by bytes. Even under the same hex
    they are stale, in one line that says why, never an error."""
    old = read_rows(ROWS)["resnet50"]
    assert old.measured is not None and old.measured.sources_hashed == "bytes"
    sources = old.measured.engine_sources or ""
    env = {k: old.measured.environment.get(k) for k in ROW_ENVIRONMENT}
    reasons = stale_reasons(old, old.measured.settings, Current(sources, env))
    assert reasons == [
        f"engine sources hashed by bytes ({sources[:12]} measured), before the hash of what "
        "they compute (`study/sources.py`)"
    ]


def test_a_marker_names_its_hash_kind_and_an_old_bare_one_reads_as_none(tmp_path):
    write_marker(tmp_path, "ab" * 32)
    assert (tmp_path / MARKER).read_text() == f"ast {'ab' * 32}\n"
    assert read_marker(tmp_path) == "ab" * 32
    (tmp_path / MARKER).write_text("ab" * 32 + "\n")  # a marker written by bytes, before
    assert read_marker(tmp_path) is None


def test_the_computed_form_drops_docstrings_and_comments_and_keeps_code(tmp_path):
    code = 'def f(x):\n    """Why."""\n    return x + 1  # one\n'
    assert python_form(code) == python_form("def f(x):\n\n    return x + 1\n")
    assert python_form(code) != python_form("def f(x):\n    return x + 2\n")
    only_doc = python_form('class A:\n    """Doc."""\n')
    assert only_doc == python_form("class A:\n    pass\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")  # does not parse: its bytes, so an edit still shows
    assert file_form(broken) == b"def (:\n"
