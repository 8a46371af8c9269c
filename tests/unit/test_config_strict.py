"""No value is coerced across types in a study's config (`record/inputs.py: StudyConfig`): a
boolean is not a number (`"seed": true` would run seed 1), neither a number nor a string is a
boolean, a float is not a count; a config file's refusal names the file and its key."""

from __future__ import annotations

import json

import pytest

from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import read_config


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"seed": True}, "--seed: input should be a valid integer (got True)"),
        ({"calib": True}, "--calib: input should be a valid integer (got True)"),
        ({"seed": 1.0}, "--seed: input should be a valid integer (got 1.0)"),
        ({"eval_batch": "64"}, "--eval-batch: input should be a valid integer (got '64')"),
        ({"batches": (1, True)}, "--batches: input should be a valid integer (got True)"),
        ({"speed": "yes"}, "--speed: input should be a valid boolean (got 'yes')"),
        ({"quality": 1}, "--quality: input should be a valid boolean (got 1)"),
        ({"package": "false"}, "--package: input should be a valid boolean (got 'false')"),
        ({"heldout": True}, "--heldout: must be a positive image count"),
    ],
)
def test_a_value_of_another_type_is_refused(given, said):
    with pytest.raises(UserError) as refused:
        StudyConfig(model="m", data="d", **given)
    assert str(refused.value).startswith(said)


def test_a_batch_of_0_is_refused_for_its_lower_bound():
    with pytest.raises(UserError) as refused:
        StudyConfig(model="m", data="d", batches=(0, 128))
    line = str(refused.value)
    assert "greater than or equal to 1" in line and "do not fit" not in line
    with pytest.raises(UserError, match="do not fit one GPU"):  # the upper bound keeps its why
        StudyConfig(model="m", data="d", batches=(1, 5000))


def test_a_config_file_is_refused_naming_the_file_and_its_key(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": "m", "data": "d", "seed": True}))
    with pytest.raises(UserError) as refused:
        read_config(path)
    assert str(refused.value) == (
        f"study config {path}: seed: input should be a valid integer (got True)"
    )
    path.write_text(json.dumps({"model": "m", "data": "d", "seed": 3, "batches": [1, 4]}))
    assert read_config(path).batches == (1, 4)  # a JSON list is the tuple it stands for
