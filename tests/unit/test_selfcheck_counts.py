"""The report's self-check allows the count of any collection the record holds, whatever its
JSON shape: a list's length, a mapping's length, and the tally of each text value in either."""

from __future__ import annotations

from quantstudy.report.selfcheck import allowed_numbers, number_tokens

# An engine's layer -> activation map of 7 residual sums (5 "none", 2 "relu"); no other number
# of this record is 7, 5 or 2.
RECORD = {
    "engines": [
        {
            "fp8_residual": {f"blocks.{i}.mlp.fc2": "none" for i in range(5)}
            | {"blocks.5.mlp.fc2": "relu", "blocks.6.mlp.fc2": "relu"},
            "fp8_real": ["a", "b", "c"],
        }
    ]
}


def test_a_mapping_is_counted_like_a_list():
    allowed = allowed_numbers(RECORD)
    assert {"7", "3"} <= allowed  # the map's length, the list's length
    assert {"5", "2"} <= allowed  # none x5, relu x2


def test_numbers_the_record_does_not_count_stay_refused():
    allowed = allowed_numbers(RECORD)
    for tok in ("4", "6", "8", "14"):
        assert tok not in allowed


def test_the_sentence_the_method_section_writes_passes():
    sentence = "7 FP8 layers summed their block's residual in the epilogue (none x5, relu x2)"
    assert set(number_tokens(sentence)) <= allowed_numbers(RECORD)
