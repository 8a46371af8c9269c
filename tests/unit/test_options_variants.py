"""The option variants' labels: the propagated fit's rows are named "propagated ...", and the
committed options record, which names them by the fit's former name "sequential ...", still reads
(`bench/options/variants.py: variant_name`)."""

import json
from pathlib import Path

import pytest

from quantstudy.bench.options.compare import compare_options
from quantstudy.bench.options.variants import VARIANTS, variant_name
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError

RECORD = Path(__file__).parents[2] / "docs/results/figures/fp8-options-lite0.json"


def _committed_labels() -> set[str]:
    record = json.loads(RECORD.read_text())
    return {row["variant"] for source in record["sources"] for row in source.get("rows", [])}


def test_no_current_variant_is_named_sequential() -> None:
    assert not [name for name in VARIANTS if "sequential" in name]
    assert "propagated compensating + bias correction" in VARIANTS


def test_every_label_of_the_committed_record_reads_as_a_current_variant() -> None:
    labels = _committed_labels()
    old = {label for label in labels if label.startswith("sequential ")}
    assert old  # the record predates the rename: the alias is what is under test
    read = {}
    for label in old:
        with pytest.warns(DeprecationWarning, match="now named 'propagated "):
            read[label] = variant_name(label)
        assert read[label] == "propagated " + label.removeprefix("sequential ")
    read |= {label: variant_name(label) for label in labels - old}
    assert not [label for label, name in read.items() if name not in VARIANTS]


def test_a_current_label_reads_unchanged_without_a_warning(
    recwarn: pytest.WarningsRecorder,
) -> None:
    assert variant_name("compensating + bias correction") == "compensating + bias correction"
    assert variant_name("no such variant") == "no such variant"
    assert not recwarn.list


def test_bench_options_takes_an_old_label_and_refuses_an_unknown_one() -> None:
    config = StudyConfig(model="tf_efficientnet_lite0", data=Path("unused"), device="cpu")
    with pytest.warns(DeprecationWarning), pytest.raises(UserError, match="'no such variant'"):
        compare_options(config, ["sequential compensating + bias correction", "no such variant"])
