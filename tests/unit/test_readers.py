"""The one strict reader (`record/readers.py`): every file format refuses, in one `UserError`,
what would make a small file expensive (aliases, deep nesting, a huge file) or ambiguous
(a repeated key, in JSON and YAML alike)."""

from __future__ import annotations

import re
import time

import pytest

from quantstudy.decision.policy import parse_policy
from quantstudy.recipe.schema import parse_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.readers import LIMITS, parse_json, parse_yaml, read_json, read_text

# Nine levels of nine aliases each: 9**9 (387 million) strings once expanded, from 600 bytes.
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_billion_laughs_is_refused_at_the_first_alias_in_a_blink():
    # this process's CPU time, not the wall clock: a loaded machine stretches the wall clock,
    # not the work done; expanding the aliases would take minutes of CPU, refusing takes micro-
    # seconds
    start = time.process_time()
    with pytest.raises(UserError, match=r"f\.yaml line 2: .*alias \*a.*not accepted"):
        parse_yaml(LAUGHS, "f.yaml")
    assert time.process_time() - start < 1.0  # nothing was expanded


@pytest.mark.parametrize(
    "parse", [lambda t: parse_recipe(t.encode(), "r.yaml"), lambda t: parse_policy(t, "p.yaml")]
)
def test_recipes_and_policies_read_through_it(parse):
    with pytest.raises(UserError, match="alias"):
        parse(LAUGHS)


def test_a_merge_key_alias_is_refused_too():
    with pytest.raises(UserError, match="alias"):
        parse_yaml("base: &b {x: 1}\nother:\n  <<: *b\n", "m.yaml")


def test_plain_yaml_and_anchors_without_aliases_still_read():
    assert parse_yaml("a: 1\nb: [x, y]\n", "ok.yaml")[1] == {"a": 1, "b": ["x", "y"]}
    assert parse_yaml("a: &n 1\n", "ok.yaml")[1] == {"a": 1}  # an anchor alone expands nothing


def test_deep_nesting_is_one_line_not_a_recursion_error():
    with pytest.raises(UserError, match="nested too deeply"):
        parse_yaml("[" * 50_000, "deep.yaml")
    with pytest.raises(UserError, match="nested too deeply"):
        parse_json("[" * 50_000, "deep.json")


def test_a_python_tag_is_refused():
    with pytest.raises(UserError, match="malformed YAML"):
        parse_yaml("x: !!python/object/apply:os.system ['true']\n", "t.yaml")


def test_a_repeated_json_key_is_refused():
    with pytest.raises(UserError, match="key 'a' repeated"):
        parse_json('{"a": 1, "b": {"a": 2}, "a": 3}', "r.json")
    assert parse_json('{"a": 1, "b": {"a": 2}}', "r.json") == {"a": 1, "b": {"a": 2}}


REPEATED = (
    "version: 2\nquality:\n  agreement: {min: 0.97}\n  kl_mean: {max: 0.02}\n"
    "  agreement: {min: 0.5}\n"
)


@pytest.mark.parametrize(
    "parse",
    [
        lambda t: parse_yaml(t, "f.yaml"),
        lambda t: parse_policy(t, "f.yaml"),
        lambda t: parse_recipe(t.encode(), "f.yaml"),
    ],
    ids=["yaml", "policy", "recipe"],
)
def test_a_repeated_yaml_key_is_refused_with_its_line(parse):
    """PyYAML keeps the last value of a repeated key without a word: a policy could read 0.97 to
    its author and 0.5 to the tool. The sweep file reads through the same reader
    (test_sweep_spec)."""
    with pytest.raises(UserError, match=r"^(policy )?f\.yaml line 5: duplicate key 'agreement'; "):
        parse(REPEATED)


def test_the_same_key_in_two_mappings_is_not_repeated():
    _, data = parse_yaml("a: {x: 1}\nb: {x: 2}\n", "f.yaml")
    assert data == {"a": {"x": 1}, "b": {"x": 2}}


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "recipe.yaml"
    with big.open("wb") as f:
        f.truncate(LIMITS["config"] + 1)  # sparse: no memory, no disk
    with pytest.raises(UserError, match=r"recipe .* at most 1 MiB"):
        read_text(big, "config", "recipe")


def test_not_utf8_and_unreadable_files_are_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(UserError, match="not UTF-8"):
        read_json(bad, "record")
    with pytest.raises(UserError, match="cannot read"):
        read_json(tmp_path, "record")  # a folder


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_that_is_not_finite_is_refused_in_a_users_json(literal):
    with pytest.raises(UserError, match=rf"g\.json: {literal} is not a finite number"):
        parse_json(f'{{"saved_ms": {{"conv": {literal}}}}}', "g.json")
    # a record may hold NaN (a metric of an engine whose logits were not finite)
    assert parse_json(f'{{"x": {literal}}}', "study.json", finite=False)["x"] != 0


@pytest.mark.parametrize("literal", [".nan", ".inf", "-.Inf", "1.0e+999"])  # YAML 1.1: dot, sign
def test_a_number_that_is_not_finite_is_refused_in_yaml_naming_its_line(literal):
    said = rf"p\.yaml line 3: {re.escape(literal)} is not a finite number"
    with pytest.raises(UserError, match=said):
        parse_yaml(f"version: 1\nquality:\n  max_kl_mean: {literal}\n", "p.yaml")
    assert parse_yaml("a: nan\nb: 1.5\n", "p.yaml")[1] == {"a": "nan", "b": 1.5}  # a string


def _read_in_time(path, seconds: float = 10.0) -> str:
    """`read_json(path)`'s refusal, from a thread given `seconds`: a reader that opened a named
    pipe would wait for a writer, and the test would hang instead of failing."""
    import threading

    said: list[str] = []

    def read() -> None:
        try:
            read_json(path, "zoo row")
        except UserError as e:
            said.append(str(e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    assert not reader.is_alive(), f"reading {path} blocked"
    assert said, f"{path} was read"
    return said[0]


def test_a_pipe_a_folder_and_a_missing_path_are_refused_unopened_naming_what_they_are(tmp_path):
    import os

    pipe = tmp_path / "row.json"
    os.mkfifo(pipe)
    assert (
        _read_in_time(pipe)
        == f"cannot read zoo row {pipe}: it is a named pipe, not a file; name a file"
    )
    (tmp_path / "dir.json").mkdir()
    assert "it is a folder, not a file" in _read_in_time(tmp_path / "dir.json")
    assert "it does not exist" in _read_in_time(tmp_path / "missing.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "gone.json")
    assert "it is a broken symbolic link" in _read_in_time(tmp_path / "link.json")
    (tmp_path / "to-pipe.json").symlink_to(pipe)  # followed: what it points at is read
    assert "it is a named pipe" in _read_in_time(tmp_path / "to-pipe.json")
