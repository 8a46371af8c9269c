"""Calibration / held-out split: seeded, disjoint, class-balanced; set summaries."""

from __future__ import annotations

import hashlib
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from quantstudy.data.folders import ImageItem
from quantstudy.data.split import check_disjoint_content, split_items, summarize_set
from quantstudy.record.errors import UserError


def _items(counts: dict[int, int], root: str = "/data", stem: str = "img") -> list[ImageItem]:
    """Synthetic labelled items: class c has counts[c] images."""
    out = []
    for label, n in counts.items():
        for j in range(n):
            rel = f"c{label:03d}/{stem}{j:02d}.jpg"
            out.append(ImageItem(rel, Path(root) / rel, label, f"c{label:03d}"))
    return out


def _unlabelled(n: int, root: str = "/plain") -> list[ImageItem]:
    return [ImageItem(f"{i:03d}.jpg", Path(root) / f"{i:03d}.jpg", None, None) for i in range(n)]


# Uneven classes, as in val-1300 (1 to 7 images a class).
UNEVEN = {c: 1 + c % 7 for c in range(30)} | {c: 7 for c in range(30, 40)}


def _assert_balanced(chosen: list[ImageItem], pool: list[ImageItem]) -> None:
    """Counts differ by more than one only where the smaller class has nothing left to give."""
    taken = Counter(i.label for i in chosen)
    available = Counter(i.label for i in pool)
    for a in available:
        for b in available:
            if taken[a] < taken[b] - 1:
                assert taken[a] == available[a], (a, b, taken[a], taken[b], available[a])


def test_deterministic_under_seed_and_input_order():
    items = _items(UNEVEN)
    first = split_items(items, 25, 60, seed=3)
    shuffled = list(items)
    random.Random(9).shuffle(shuffled)
    assert split_items(shuffled, 25, 60, seed=3) == first
    assert split_items(items, 25, 60, seed=4) != first
    for part in first:
        assert [i.id for i in part] == sorted(i.id for i in part)


def test_disjoint_and_sized_from_one_folder():
    items = _items(UNEVEN)
    calib, heldout = split_items(items, 25, 60, seed=0)
    assert (len(calib), len(heldout)) == (25, 60)
    assert not {i.id for i in calib} & {i.id for i in heldout}
    assert not {i.path for i in calib} & {i.path for i in heldout}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_class_balanced_where_folder_permits(seed):
    items = _items(UNEVEN)
    calib, heldout = split_items(items, 50, 100, seed=seed)
    _assert_balanced(calib, items)
    calib_ids = {i.id for i in calib}
    _assert_balanced(heldout, [i for i in items if i.id not in calib_ids])
    # 40 classes, 50 images: every class at least once, none more than twice
    counts = Counter(i.label for i in calib)
    assert len(counts) == 40 and max(counts.values()) == 2


def test_balance_detects_a_greedy_take():
    """The balance check is not vacuous: the first 50 items by id are badly unbalanced."""
    items = _items(UNEVEN)
    greedy = sorted(items, key=lambda i: i.id)[:50]
    with pytest.raises(AssertionError):
        _assert_balanced(greedy, items)


def test_separate_calibration_folder():
    heldout_pool = _items({c: 3 for c in range(10)}, root="/val")
    calib_pool = _items({c: 1 for c in range(20)}, root="/calib", stem="cal")
    # an image that sits in both folders (same path) must not land in both sets
    shared = heldout_pool[0]
    calib_pool.append(ImageItem("extra/" + shared.id, shared.path, shared.label, shared.wnid))
    calib, heldout = split_items(heldout_pool, 21, 30, seed=0, calib_items=calib_pool)
    assert len(calib) == 21
    assert {i.path for i in calib} <= {i.path for i in calib_pool}
    assert {i.path for i in heldout} <= {i.path for i in heldout_pool}
    assert shared not in heldout and len(heldout) == 29
    # held-out from another folder does not depend on how many calibration images were drawn
    _, heldout_small = split_items(heldout_pool, 5, 10, seed=0, calib_items=calib_pool[:20])
    _, heldout_large = split_items(heldout_pool, 20, 10, seed=0, calib_items=calib_pool[:20])
    assert heldout_small == heldout_large


def test_same_id_in_both_folders_is_excluded():
    val = _items({0: 2}, root="/val")
    calib = _items({0: 2}, root="/calib")  # same relative ids, other files
    got_calib, got_heldout = split_items(val, 1, 5, seed=0, calib_items=calib)
    assert got_calib[0].id not in {i.id for i in got_heldout}
    assert len(got_heldout) == 1


def test_fewer_images_than_asked_takes_all():
    items = _items({0: 3, 1: 2})
    calib, heldout = split_items(items, 4, 100, seed=0)
    assert len(calib) == 4 and len(heldout) == 1
    assert Counter(i.label for i in calib) == {0: 2, 1: 2}


def test_counts_must_be_positive():
    items = _items({0: 3})
    with pytest.raises(UserError, match="calibration image count must be positive"):
        split_items(items, 0, 1)
    with pytest.raises(UserError, match="held-out image count must be positive"):
        split_items(items, 1, -2)


def test_unlabelled_seeded_sample():
    items = _unlabelled(50)
    calib, heldout = split_items(items, 10, 15, seed=1)
    assert (len(calib), len(heldout)) == (10, 15)
    assert not {i.id for i in calib} & {i.id for i in heldout}
    assert split_items(items, 10, 15, seed=1) == (calib, heldout)
    assert split_items(items, 10, 15, seed=2) != (calib, heldout)
    assert [i.id for i in calib] != [f"{i:03d}.jpg" for i in range(10)]  # not just the first ten


def test_summarize_labelled_and_unlabelled():
    items = _items({5: 3, 9: 1})
    summary = summarize_set("calibration", Path("/data"), list(reversed(items)), labelled=True)
    ids = sorted(i.id for i in items)
    assert summary.ids == ids and summary.n_images == 4 and summary.folder == "/data"
    assert summary.ids_sha256 == hashlib.sha256("\n".join(ids).encode()).hexdigest()
    assert (summary.n_classes, summary.per_class_min, summary.per_class_max) == (2, 1, 3)
    plain = summarize_set("heldout", "/plain", _unlabelled(3), labelled=False)
    assert (plain.n_classes, plain.per_class_min, plain.per_class_max) == (None, None, None)
    assert plain.role == "heldout" and plain.labelled is False


def _files(folder, contents: dict[str, bytes], label: int | None = None) -> list[ImageItem]:
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for name, data in contents.items():
        (folder / name).write_bytes(data)
        items.append(ImageItem(id=name, path=folder / name, label=label, wnid=None))
    return items


def test_a_byte_identical_copy_in_both_sets_is_refused(tmp_path):
    calib = _files(tmp_path / "calib", {"a.png": b"image a", "b.png": b"image b"})
    heldout = _files(tmp_path / "data", {"x.png": b"image x", "copy.png": b"image b"})
    with pytest.raises(UserError, match=r"copy\.png has the same content as .*b\.png"):
        check_disjoint_content(calib, heldout)


def test_a_hard_link_in_both_sets_is_refused(tmp_path):
    calib = _files(tmp_path / "calib", {"a.png": b"image a"})
    (tmp_path / "data").mkdir()
    os.link(tmp_path / "calib" / "a.png", tmp_path / "data" / "linked.png")
    heldout = [ImageItem("linked.png", tmp_path / "data" / "linked.png", None, None)]
    with pytest.raises(UserError, match="same content"):
        check_disjoint_content(calib, heldout)


def test_same_size_but_other_content_passes(tmp_path):
    calib = _files(tmp_path / "calib", {"a.png": b"image a"})
    heldout = _files(tmp_path / "data", {"z.png": b"image z"})  # same length, other bytes
    check_disjoint_content(calib, heldout)
