"""The zoo without running a study: its committed list, shards, the points it hands the sweep,
and the leaderboard files (CSV, JSON, Markdown, plot) written from study records.

The records here are the constructed H200-shaped fixture (tests/unit/_records.py: no measured
value), given the fields a zoo row reads; the real zoo on tiny models is `test_zoo_run.py`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import timm
import torch
from torch import nn

from quantstudy.model.macs import count_macs
from quantstudy.record import IdealSpeed, StageTime, StudyRecord, TimingsSection
from quantstudy.record.errors import UserError
from quantstudy.sweep.events import Job
from quantstudy.sweep.point import POINT_FILE, PointStatus
from quantstudy.zoo.board import Leaderboard
from quantstudy.zoo.catalogue import ZooEntry, load_catalogue, parse_shard
from quantstudy.zoo.points import ZooOptions, zoo_point
from quantstudy.zoo.render import csv_columns
from quantstudy.zoo.run import write_leaderboard

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "study_example.json"
# Models others report as hard for FP8, and the families the tool was first measured on.
HARD_CASES = (
    "mobilenetv3_small_050",
    "efficientnet_b0",
    "resnet50",
    "vit_base_patch16_224",
    "swin_tiny_patch4_window7_224",
    "convnext_tiny",
    "deit_small_patch16_224",
    "regnety_016",
    "levit_128s",
    "mobilenetv4_conv_large",
    "ghostnet_100",
    "xception41",
    "crossvit_9_240",
    "res2net50_26w_4s",
    "tf_efficientnet_lite0",
)


def test_committed_list_is_wide_and_every_name_is_a_timm_model():
    catalogue = load_catalogue()
    names = [e.name for e in catalogue.entries]
    assert len(names) >= 50 and len({e.family for e in catalogue.entries}) >= 25
    known = set(timm.list_models())
    assert [n for n in names if n not in known] == []
    assert [n for n in HARD_CASES if n not in names] == []
    assert any(n.startswith("efficientvit_") for n in names)
    # the smallest MaxViT size timm has
    smallest = min(_size_rank(m) for m in known if m.startswith("maxvit_"))
    assert any(n.startswith("maxvit_") and _size_rank(n) == smallest for n in names)


def _size_rank(name: str) -> int:
    """timm's MaxViT sizes, smallest first (pico < nano < tiny < small < base < large < xlarge)."""
    sizes = ("pico", "nano", "tiny", "small", "base", "large", "xlarge")
    return next((i for i, s in enumerate(sizes) if f"_{s}_" in name), len(sizes))


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_split_the_list_into_disjoint_even_parts(count):
    entries = load_catalogue().entries
    parts = [parse_shard(f"{i}/{count}").take(entries) for i in range(1, count + 1)]
    assert sorted(e.name for p in parts for e in p) == sorted(e.name for e in entries)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("text", ["0/4", "5/4", "2", "a/b", "2/0"])
def test_bad_shard_is_one_line(text):
    with pytest.raises(UserError, match="give I/N with 1 <= I <= N"):
        parse_shard(text)


def test_bad_list_names_the_line(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("models:\n  - {name: resnet18}\n  - {name: resnet18, famly: resnet}\n")
    with pytest.raises(UserError, match=r"line 3: models\.1\.famly: unknown key 'famly'"):
        load_catalogue(path)
    # an older list's family is read and left out: the family is the model's
    path.write_text("models:\n  - {name: resnet18, family: x}\n  - {name: resnet18}\n")
    with pytest.raises(UserError, match=r"line 3: models\.1\.name: resnet18 is listed twice"):
        load_catalogue(path)
    # a name timm does not have: refused as the list is read (`zoo --dry-run` too)
    path.write_text("models:\n  - {name: resnet18}\n  - {name: resnet81}\n")
    with pytest.raises(UserError, match=r"line 3: models\.1\.name: unknown timm model 'resnet81'"):
        load_catalogue(path)


def test_points_are_speed_only_with_random_weights_and_full_with_real_ones(tmp_path):
    entry = ZooEntry(name="tf_efficientnet_lite0", weights="w")
    options = ZooOptions(data=tmp_path, out=tmp_path / "out", study={"batches": (1, 128)})
    random_point = zoo_point(entry, options, "cuda").config
    assert random_point.weights == "random" and not random_point.quality and random_point.speed
    assert random_point.recipe is None  # the study picks the model's default
    assert random_point.batches == (1, 128) and random_point.fp8_kernel == "fused"
    real = zoo_point(entry, ZooOptions(data=tmp_path, out=tmp_path, weights="cache"), "cuda")
    assert real.config.weights == "w" and real.config.quality


def test_macs_count_conv_and_linear_work_per_image():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),  # 8x8 output, 8 channels, 3*3*3 per output
        nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise: 3*3 per output
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )
    macs = count_macs(model, torch.zeros(2, 3, 8, 8))
    assert macs == 8 * 8 * 8 * 27 + 8 * 8 * 8 * 9 + 10 * 512
    assert not model[0]._forward_hooks  # the hooks are removed


def _records() -> tuple[StudyRecord, StudyRecord]:
    """A real-weights study with quality and a speed-only random-weights one, each with the
    fields a zoo row reads (MACs, the ideal x, stage timings)."""
    full = StudyRecord.model_validate_json(FIXTURE.read_text())
    assert full.speed is not None
    ideal = [
        IdealSpeed(
            batch=b.batch, peaks="H200", layers=54, fp16_products_us=1.0,
            fp16_elementwise_us=0.1, fp8_roofline_us=0.5, fp16_ms=b.fp16_ms.median,
            ideal_x=1.5, measured_x=b.ratio.median, fraction=b.ratio.median / 1.5,
        )
        for b in full.speed.batches
    ]  # fmt: skip
    stages = [StageTime(stage="engine fp8: build", seconds=3.0)]
    stages += [StageTime(stage="engine fp8: compile at batch 128", seconds=4.0)]
    stages += [StageTime(stage="timing", seconds=5.0)]
    full = full.model_copy(
        update={
            "model": full.model.model_copy(update={"macs": 2_500_000_000}),
            "speed": full.speed.model_copy(update={"ideal": ideal}),
            "timings": TimingsSection(stages=stages, total_s=20.0),
        }
    )
    speed_only = full.model_copy(
        update={
            "config": full.config.replace(weights="random", quality=False),
            "model": full.model.model_copy(
                update={"weights": "random", "random_weights": True, "macs": 400_000_000}
            ),
            "quality": None,
        }
    )
    return full, speed_only


def _point_folder(out: Path, job: Job, status: str, error: str | None = None) -> None:
    folder = out / job.folder
    folder.mkdir(parents=True)
    point = PointStatus(
        folder=job.folder, settings=job.point, argv=["quantstudy"], status=status,  # type: ignore[arg-type]
        attempts=1, error=error, wall_s=30.0, host="h", started_utc="t",
    )  # fmt: skip
    (folder / POINT_FILE).write_text(point.model_dump_json())


def test_leaderboard_files_from_records_and_a_failed_model(tmp_path):
    options = ZooOptions(data=tmp_path, out=tmp_path / "out", study={"batches": (1, 32, 128)})
    entries = [
        ZooEntry(name="mobilenetv4_conv_large"),
        ZooEntry(name="ghostnet_100"),
        ZooEntry(name="dla34"),
        ZooEntry(name="resnet18"),
    ]
    listed = [(e, Job(zoo_point(e, options, "cuda"), f"folder-{e.name}")) for e in entries]
    out = tmp_path / "out"
    full, speed_only = _records()
    for (_, job), record in zip(listed[:2], (full, speed_only), strict=False):
        _point_folder(out, job, "complete")
        (out / job.folder / "study.json").write_text(record.model_dump_json())
    _point_folder(out, listed[2][1], "failed", "TypeError: can only concatenate list")
    catalogue = load_catalogue()
    board = write_leaderboard(options, catalogue, listed, out, "cuda")
    counts = {"complete": 2, "failed": 1, "interrupted": 0, "partial": 0, "pending": 1}
    counts["no_layer"] = 0  # zoo only: a recipe that selects nothing (zoo/answers.py)
    assert board.counts == counts
    assert Leaderboard.model_validate_json((out / "zoo.json").read_text()) == board
    env = board.provenance.environments
    assert env == [{**env[0], "gpu_name": "NVIDIA H200"}] and board.provenance.driver["torch"]

    rows = list(csv.DictReader(io.StringIO((out / "zoo.csv").read_text())))
    assert list(rows[0]) == csv_columns([1, 32, 128])
    first, second, failed, pending = rows
    b128 = next(b for b in full.speed.batches if b.batch == 128)  # type: ignore[union-attr]
    assert float(first["x_b128"]) == round(b128.ratio.median, 4)
    assert float(first["x_b128_q1"]) == round(b128.ratio.q1, 4)
    assert float(first["ideal_fraction_b128"]) == round(b128.ratio.median / 1.5, 4)
    fp8 = next(e for e in full.engines if e.name == "fp8")
    assert first["gmacs_conv_linear"] == "2.5" and first["fp8_layers"] == str(len(fp8.fp8_real))
    assert full.recipe is not None
    assert first["conv_linear_layers"] == str(len(full.recipe.selected) + len(full.recipe.excluded))
    assert first["decision"] == str(full.decision.outcome)  # type: ignore[union-attr]
    assert (first["quality_measured"], second["quality_measured"]) == ("True", "False")
    assert second["decision"] == "" and second["agreement"] == ""  # never from random weights
    assert first["build_s"] == "7.0" and first["study_s"] == "20.0"
    assert failed["status"] == "failed" and "concatenate" in failed["error"]
    assert pending["status"] == "pending" and pending["x_b1"] == ""

    md = (out / "zoo.md").read_text()
    assert "| mobilenetv4_conv_large | mobilenetv4 |" in md and "speed only" in md
    assert "## Models that failed" in md and "dla34: TypeError" in md
    assert "Median x at batch 128 per family" in md and "![x at batch 128" in md
    assert board.plot == "zoo.png" and (out / "zoo.png").stat().st_size > 0
    assert json.loads((out / "zoo.json").read_text())["rows"][1]["weights"] == "random"
