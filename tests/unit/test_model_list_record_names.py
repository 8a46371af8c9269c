"""`tools/lab/gpu/package_bench.py`'s models: a model list read by the one reader
(`study/model_list.py`), by the short names its committed records and device jobs go by."""

import json
import re
from pathlib import Path

import pytest
from _tools import TOOLS, load_tool

_bench = load_tool("lab/gpu/package_bench.py")
REPO = TOOLS.parent
RECORDS = sorted((REPO / "docs" / "results" / "package").glob("package-bench-*.json"))


def test_the_list_reads_through_the_one_model_list_reader():
    from quantstudy.study.model_list import read_model_list

    models = _bench.models()
    assert models == {_bench.record_name(e.name): e for e in read_model_list(_bench.LIST).entries}
    lite0 = models["lite0"]
    assert (lite0.name, lite0.weights, lite0.recipe) == (
        "tf_efficientnet_lite0", "efficientnet-lite0", "generic_pointwise",
    )  # fmt: skip
    assert models["xception41"].weights == "random" and models["xception41"].recipe is None


def test_the_names_of_committed_records_and_device_jobs_still_work():
    named = {json.loads(r.read_text())["model"] for r in RECORDS}
    assert named and named <= set(_bench.models())  # lite0, xception41
    jobs = (TOOLS / "device" / "jobs" / "records.yaml").read_text()
    given = set(re.findall(r"package_bench\.py\s+--model\s+(\S+)", jobs))
    assert given and given <= set(_bench.models())


def test_model_takes_the_record_name_or_the_timm_name():
    parse = _bench.parser().parse_args
    args = parse(["--model", "tf_efficientnet_lite0", "lite0", "xception41", "--data", "d"])
    assert args.model == ["lite0", "lite0", "xception41"] and args.data == Path("d")
    with pytest.raises(SystemExit):
        parse(["--model", "resnet50", "--data", "d"])  # not in the list
