"""The per-image side file (sealed by the record) and `quantstudy extend`'s refusals."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from _records import build_record
from test_heldout_auto import _rows

from quantstudy.cli import main
from quantstudy.data.folders import scan_folder
from quantstudy.record import ImageSet, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_record
from quantstudy.record.load import load_record
from quantstudy.study.extend import _new_items
from quantstudy.study.per_image import PerImageResults, seal, set_ids, unseal


def _results(n: int = 6) -> PerImageResults:
    return PerImageResults(_rows(n), [f"img{i}" for i in range(n)], np.arange(n) % 7)


def test_the_side_file_round_trips_and_a_changed_one_is_refused(tmp_path: Path):
    results = _results()
    side = seal(tmp_path, results)
    assert side.images == 6 and (tmp_path / side.path).is_file()
    back = unseal(tmp_path, side)
    assert back.ids == results.ids and np.array_equal(back.labels, results.labels)
    assert back.rows.to_tensors().keys() == results.rows.to_tensors().keys()
    joined = back.then(_results(2))
    assert joined.rows.n_images == 8 and joined.ids[-1] == "img1"
    (tmp_path / side.path).write_bytes((tmp_path / side.path).read_bytes() + b"x")
    with pytest.raises(UserError, match="does not match its study record"):
        unseal(tmp_path, side)
    with pytest.raises(UserError, match="keeps no per-image results"):
        unseal(tmp_path, None)


def _study_of(folder: Path, data: Path) -> Path:
    """A finished study record whose held-out images are the first 8 of `data`."""
    ids = [i.id for i in scan_folder(data).items]
    record = build_record()
    heldout = record.data.heldout.model_copy(update={"ids": ids[:8], "n_images": 8})
    calib = record.data.calibration.model_copy(update={"ids": ids[8:10], "n_images": 2})
    update = {"data_dir": str(data), "calib_dir": None, "heldout": heldout, "calibration": calib}
    record = record.model_copy(update={"data": record.data.model_copy(update=update)})
    folder.mkdir()
    write_record(folder / "study.json", record)
    return folder


def test_images_the_study_used_are_refused_by_id_and_by_content(tiny_imagenet, tmp_path):
    study = _study_of(tmp_path / "study", tiny_imagenet)
    record = load_record(study / "study.json")
    more = tmp_path / "more"
    shutil.copytree(tiny_imagenet, more)  # same ids: 10 of its 12 images are the study's
    with pytest.raises(UserError, match=r"10 images of .* are already in the study .*--skip-used"):
        _new_items(study, record, scan_folder(more), skip_used=False)
    fresh = _new_items(study, record, scan_folder(more), skip_used=True)
    assert [i.id for i in fresh] == [i.id for i in scan_folder(tiny_imagenet).items][10:]
    renamed = tmp_path / "renamed"  # the same files under other names: still the same images
    for item in scan_folder(tiny_imagenet).items[:3]:
        target = renamed / item.id.replace("img", "copy")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(item.path, target)
    with pytest.raises(UserError, match="3 images of"):
        _new_items(study, record, scan_folder(renamed), skip_used=False)


def test_extend_refuses_in_one_line(tiny_imagenet, tmp_path, capsys):
    study = _study_of(tmp_path / "study", tiny_imagenet)
    assert main(["extend", str(study), "--data", str(tiny_imagenet)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keeps no per-image results" in err[0]  # an old record
    assert main(["extend", str(tmp_path / "nowhere"), "--data", str(tiny_imagenet)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_extended_sets_load_in_the_record():
    record = build_record()
    extra = ImageSet(
        role="heldout", folder="more", labelled=True, n_images=0, ids_sha256="0", ids=[]
    )
    data = record.data.model_copy(update={"extended": [extra]})
    assert record.model_copy(update={"data": data}).data.extended[0].folder == "more"


@pytest.mark.suite
def test_a_sequential_study_then_extend_end_to_end_on_cpu(tiny_imagenet, tmp_path, capsys):
    """`run --heldout auto:8`, then `extend` with six other images: one look each, the
    quality over all 14 images, the extension and the side file in the record."""
    import json

    import torch
    from PIL import Image

    more = tmp_path / "more" / "n01440764"
    more.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    for i in range(6):
        pixels = (torch.rand(48, 48, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(more / f"new{i}.jpg")
    out = tmp_path / "study"
    argv = (
        "run mobilenetv4_conv_small --weights random --device cpu --calib 4 --heldout auto:8 "
        f"--no-speed --data {tiny_imagenet} --out {out}"
    ).split()
    assert main(argv) == 4  # inconclusive: random weights, no speed
    record = json.loads((out / "study.json").read_text())
    assert record["config"]["heldout"] == "auto:8"
    looks = record["sequential"]["looks"]
    assert [look["images"] for look in looks] == [8]
    assert record["sequential"]["stop_reason"] in ("upper_bound", "data_exhausted")
    assert record["per_image"]["images"] == 8
    capsys.readouterr()
    assert main(["extend", str(out), "--data", str(more.parent)]) == 4
    record = json.loads((out / "study.json").read_text())
    assert [look["images"] for look in record["sequential"]["looks"]] == [8, 14]
    assert record["data"]["extended"][0]["n_images"] == 6
    assert record["per_image"]["images"] == 14
    # the held-out ids live in the side file only; read back, they hash as the record says
    assert record["data"]["heldout"]["ids"] is None and record["data"]["extended"][0]["ids"] is None
    typed = StudyRecord.model_validate(record)
    assert set_ids(out, typed, typed.data.extended[0]) == [
        f"n01440764/new{i}.jpg" for i in range(6)
    ]
    assert len(set_ids(out, typed, typed.data.heldout)) == 8
    edited = typed.data.heldout.model_copy(update={"ids_sha256": "0" * 64})
    bad = typed.model_copy(update={"data": typed.data.model_copy(update={"heldout": edited})})
    with pytest.raises(UserError, match="do not name the images"):
        set_ids(out, bad, edited)
    assert all(q["n_images"] == 14 for q in record["quality"]["engines"])
    assert (out / "report.md").is_file()
    assert main(["extend", str(out), "--data", str(more.parent)]) == 1  # the same images again
    assert "already in the study" in capsys.readouterr().err
