"""The package bench's models (`tools/lab/gpu/package-models.yaml`) read by the one model-list
reader (`study/model_list.py`), by the short names its committed records and device jobs go by."""

import json
import re
from pathlib import Path

from quantstudy.study.model_list import by_record_name, read_model_list, record_name

REPO = Path(__file__).resolve().parents[2]
LIST = REPO / "tools" / "lab" / "gpu" / "package-models.yaml"
RECORDS = sorted((REPO / "docs" / "results" / "package").glob("package-bench-*.json"))


def test_the_list_reads_through_the_one_model_list_reader():
    models = by_record_name(LIST)
    listed = read_model_list(LIST).entries
    assert list(models.values()) == list(listed)  # every entry, one name each
    lite0 = models["lite0"]
    assert (lite0.name, lite0.weights, lite0.recipe) == (
        "tf_efficientnet_lite0", "efficientnet-lite0", "generic_pointwise",
    )  # fmt: skip
    assert models["xception41"].weights == "random" and models["xception41"].recipe is None


def test_the_names_of_committed_records_and_device_jobs_still_work():
    models = by_record_name(LIST)
    named = {json.loads(r.read_text())["model"] for r in RECORDS}
    assert named and named <= set(models)  # lite0, xception41
    jobs = (REPO / "tools" / "device" / "jobs" / "records.yaml").read_text()
    given = set(re.findall(r"package_bench\.py\s+--model\s+(\S+)", jobs))
    assert given and given <= set(models)


def test_a_model_goes_by_its_short_name_or_else_its_timm_name():
    assert [record_name(n) for n in ("tf_efficientnet_lite0", "lite0", "xception41")] == [
        "lite0", "lite0", "xception41",
    ]  # fmt: skip
    assert "resnet50" not in by_record_name(LIST)  # not in the list
