"""Folder scanning, image loading and the demo images (tiny synthetic folders, no shared data)."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
import timm.data
import torch
from PIL import Image

from quantstudy.data import demo
from quantstudy.data.folders import read_class_list, scan_folder
from quantstudy.data.images import load_images
from quantstudy.model.preprocess import build_transform
from quantstudy.record import Preprocessing
from quantstudy.record.errors import UserError

WNIDS = timm.data.ImageNetInfo().label_names()


def _jpeg(path: Path, color: int = 128, size: tuple[int, int] = (12, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (color, 255 - color, 7)).save(path, format="JPEG")
    return path


def _truncated_jpeg(path: Path) -> Path:
    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buffer, format="JPEG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


# --- labelled folders -----------------------------------------------------------------------


def test_subset_folder_maps_through_full_class_list(tmp_path):
    a, b = WNIDS[400], WNIDS[700]
    _jpeg(tmp_path / b / "y.jpg")
    _jpeg(tmp_path / a / "x2.JPEG")
    _jpeg(tmp_path / a / "x1.jpeg")
    scan = scan_folder(tmp_path)
    assert scan.labelled and scan.class_list is None and scan.skipped == []
    assert [(i.id, i.label, i.wnid) for i in scan.items] == [
        (f"{a}/x1.jpeg", 400, a),
        (f"{a}/x2.JPEG", 400, a),
        (f"{b}/y.jpg", 700, b),
    ]
    assert scan.items[0].path == tmp_path / a / "x1.jpeg"


def test_custom_class_list_and_unknown_subfolder(tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\nbird\n")
    data = tmp_path / "data"
    _jpeg(data / "bird" / "1.png")
    _jpeg(data / "cat" / "2.png")
    scan = scan_folder(data, classes)
    assert [(i.wnid, i.label) for i in scan.items] == [("bird", 2), ("cat", 0)]
    assert scan.class_list == classes
    _jpeg(data / "fish" / "3.png")
    with pytest.raises(UserError, match="subfolder 'fish'"):
        scan_folder(data, classes)
    with pytest.raises(UserError, match="not a class in timm's ImageNet-1k"):
        scan_folder(data)


def test_class_list_must_be_clean(tmp_path):
    gap = tmp_path / "gap.txt"
    gap.write_text("a\n\nb\n")
    with pytest.raises(UserError, match="empty line 2"):
        read_class_list(gap)
    twice = tmp_path / "twice.txt"
    twice.write_text("a\nb\na\n")
    with pytest.raises(UserError, match="'a' repeated on line 3"):
        read_class_list(twice)
    with pytest.raises(UserError, match="does not exist"):
        read_class_list(tmp_path / "absent.txt")
    assert read_class_list(None) == WNIDS and len(WNIDS) == 1000


def test_bad_files_are_skipped_and_recorded(tmp_path):
    wnid = WNIDS[3]
    _jpeg(tmp_path / wnid / "good.jpg")
    _truncated_jpeg(tmp_path / wnid / "truncated.jpg")
    (tmp_path / wnid / "garbage.png").write_bytes(b"not a png at all")
    (tmp_path / wnid / "notes.txt").write_text("hello")
    (tmp_path / "README").write_text("stray file at the root")
    scan = scan_folder(tmp_path)
    assert [i.id for i in scan.items] == [f"{wnid}/good.jpg"]
    reasons = {s.id: s.reason for s in scan.skipped}
    assert set(reasons) == {
        "README",
        f"{wnid}/garbage.png",
        f"{wnid}/notes.txt",
        f"{wnid}/truncated.jpg",
    }
    assert "cannot decode" in reasons[f"{wnid}/truncated.jpg"]
    assert "cannot decode" in reasons[f"{wnid}/garbage.png"]
    assert "not an image file" in reasons[f"{wnid}/notes.txt"]
    assert "outside the class folders" in reasons["README"]


def _special_files(folder: Path) -> dict[str, str]:
    """A named pipe, a socket, a device file and a broken link, each named like an image (the
    pipe would block a reader until a writer came), and a folder named like one; what each
    must be skipped as."""
    import contextlib
    import os
    import socket

    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "pipe.png")
    # bound by its relative name: a socket's path must fit 107 bytes, which pytest's temporary
    # folders under a deep TMPDIR (the device's batch runner) exceed
    with socket.socket(socket.AF_UNIX) as sock, contextlib.chdir(folder):
        sock.bind("sock.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")  # read without end
    (folder / "gone.jpg").symlink_to(folder / "absent.jpg")
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")
    return {
        "pipe.png": "a named pipe",
        "sock.jpg": "a socket",
        "zero.jpg": "a device file",
        "gone.jpg": "a broken symbolic link",
        "loop.jpg": "cannot be examined",
    }


def test_special_files_are_skipped_unopened_with_their_kind(tmp_path):
    wnid = WNIDS[3]
    _jpeg(tmp_path / wnid / "good.jpg")
    kinds = _special_files(tmp_path / wnid)
    (tmp_path / wnid / "folder.jpg").mkdir()
    scan = scan_folder(tmp_path)  # ends: no pipe is opened
    assert [i.id for i in scan.items] == [f"{wnid}/good.jpg"]
    reasons = {s.id: s.reason for s in scan.skipped}
    assert "folder inside a class folder" in reasons.pop(f"{wnid}/folder.jpg")
    assert set(reasons) == {f"{wnid}/{name}" for name in kinds}
    for name, kind in kinds.items():
        assert reasons[f"{wnid}/{name}"].startswith(f"not a regular file ({kind}")


def test_special_files_in_a_plain_folder_are_skipped_not_dropped(tmp_path):
    _jpeg(tmp_path / "a.png")
    kinds = _special_files(tmp_path)
    scan = scan_folder(tmp_path)
    assert not scan.labelled and [i.id for i in scan.items] == ["a.png"]
    reasons = {s.id: s.reason for s in scan.skipped}
    assert set(reasons) == set(kinds)  # none dropped unsaid
    for name, kind in kinds.items():
        assert reasons[name].startswith(f"not a regular file ({kind}"), reasons[name]


# --- unlabelled and rejected folders --------------------------------------------------------


def test_plain_folder_is_unlabelled(tmp_path):
    _jpeg(tmp_path / "b.jpg")
    _jpeg(tmp_path / "a.png")
    (tmp_path / "c.json").write_text("{}")
    scan = scan_folder(tmp_path)
    assert not scan.labelled
    assert [(i.id, i.label, i.wnid) for i in scan.items] == [
        ("a.png", None, None),
        ("b.jpg", None, None),
    ]
    assert [s.id for s in scan.skipped] == ["c.json"]


def test_unusable_folders_raise(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        scan_folder(tmp_path / "absent")
    a_file = _jpeg(tmp_path / "one.jpg")
    with pytest.raises(UserError, match="not a folder"):
        scan_folder(a_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no usable image"):
        scan_folder(empty)
    only_bad = tmp_path / "bad"
    _truncated_jpeg(only_bad / WNIDS[0] / "t.jpg")
    with pytest.raises(UserError, match=r"no usable image .*1 files skipped"):
        scan_folder(only_bad)


# --- loading images -------------------------------------------------------------------------

_PRE = Preprocessing(
    input_size=(3, 8, 8),
    crop_pct=1.0,
    crop_mode="center",
    interpolation="bilinear",
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    settings="train",
    source="test",
)


def test_load_images_stacks_in_item_order(tmp_path):
    for i, color in enumerate((0, 255, 128)):
        _jpeg(tmp_path / WNIDS[10 * i] / f"{i}.png", color=color)
    items = scan_folder(tmp_path).items
    images, labels = load_images(items, build_transform(_PRE), batch_size=2, desc="test")
    assert images.shape == (3, 3, 8, 8) and images.dtype == torch.float32
    assert labels.tolist() == [0, 10, 20] and labels.dtype == torch.int64
    red = images[:, 0].mean(dim=(1, 2))
    assert red[0] < 0.05 and red[1] > 0.95 and 0.4 < red[2] < 0.6


def test_load_images_unlabelled(tmp_path):
    _jpeg(tmp_path / "a.jpg")
    images, labels = load_images(scan_folder(tmp_path).items, build_transform(_PRE))
    assert images.shape == (1, 3, 8, 8) and labels is None


# --- demo images ------------------------------------------------------------------------------


def test_foolbox_demo_from_wheel(tmp_path, monkeypatch, foolbox_wheel):
    monkeypatch.setenv(demo.WHEEL_ENV, str(foolbox_wheel))
    data = demo.foolbox_demo(tmp_path)
    assert data.data_dir == tmp_path / "foolbox-imagenet-20" and data.calib_dir is None
    scan = scan_folder(data.data_dir)
    assert len(scan.items) == 20 and scan.skipped == []
    for item in scan.items:  # file name imagenet_<i>_<label>.jpg sits in the label's wnid folder
        label = int(item.path.stem.rsplit("_", 1)[1])
        assert (item.label, item.wnid) == (label, WNIDS[label])
    assert {i.label for i in scan.items} >= {243, 559, 990}
    monkeypatch.delenv(demo.WHEEL_ENV)  # second call reuses the unpacked folder, no wheel needed
    assert demo.foolbox_demo(tmp_path).data_dir == data.data_dir


def test_foolbox_demo_errors(tmp_path, monkeypatch):
    monkeypatch.setenv(demo.WHEEL_ENV, str(tmp_path / "absent.whl"))
    with pytest.raises(UserError, match="is not a file"):
        demo.foolbox_demo(tmp_path)
    not_a_wheel = tmp_path / "fake.whl"
    not_a_wheel.write_bytes(b"nope")
    monkeypatch.setenv(demo.WHEEL_ENV, str(not_a_wheel))
    with pytest.raises(UserError, match="not a readable wheel"):
        demo.foolbox_demo(tmp_path)
    monkeypatch.delenv(demo.WHEEL_ENV)
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: no network")
    monkeypatch.setattr(demo.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(UserError, match=r"could not fetch the demo images.*no network"):
        demo.foolbox_demo(tmp_path / "cache")


def test_demo_data_prefers_shared_data(tmp_path, monkeypatch):
    (tmp_path / "val-1300").mkdir()
    (tmp_path / "calib-1000").mkdir()
    (tmp_path / "classes.txt").write_text("\n".join(WNIDS) + "\n")
    monkeypatch.setenv(demo.SHARED_ENV, str(tmp_path))
    data = demo.demo_data(cache_dir=tmp_path / "unused")
    assert data.data_dir == tmp_path / "val-1300"
    assert data.calib_dir == tmp_path / "calib-1000"
    assert data.class_list == tmp_path / "classes.txt"
    assert not (tmp_path / "unused").exists()
    monkeypatch.setenv(demo.SHARED_ENV, str(tmp_path / "absent"))
    with pytest.raises(UserError, match="no val-1300"):
        demo.demo_data(cache_dir=tmp_path / "unused")


def test_an_image_over_pillows_pixel_limit_is_skipped_with_the_reason_and_no_warning(
    tmp_path, monkeypatch
):
    """Pillow warns of an image above its decompression-bomb limit at every open (the scan's and
    the load's: twice on the console); the scan skips it with that reason instead, said once."""
    import warnings

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 40)  # a 50x50 image is over it
    _jpeg(tmp_path / "small.jpg", size=(30, 30))
    _jpeg(tmp_path / "huge.jpg", size=(50, 50))  # over the limit: warned (1x to 2x)
    _jpeg(tmp_path / "bomb.jpg", size=(80, 80))  # over twice the limit: Pillow's error
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        scan = scan_folder(tmp_path)
    assert [i.id for i in scan.items] == ["small.jpg"]
    reasons = {s.id: s.reason for s in scan.skipped}
    assert set(reasons) == {"huge.jpg", "bomb.jpg"}
    assert all("decompression-bomb limit" in r for r in reasons.values())
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


def test_shared_data_none_means_the_foolbox_images(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantstudy.data import demo

    monkeypatch.setenv(demo.SHARED_ENV, "none")
    assert demo.find_shared_data() is None
