"""Seeded, class-balanced, disjoint calibration and held-out sets.

Calibrating on held-out images would flatter the quantized model, so the two sets never share an
image: not by id, not by file, and not by content (`check_disjoint_content`: a hard link or a
byte-identical copy of one image in both sets is refused). Balance keeps one over-represented
class from steering the scales or the accuracy: per-class counts differ by at most one wherever
the folder has enough images.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Literal

from quantstudy.data.folders import ImageItem
from quantstudy.record import ImageSet
from quantstudy.record.errors import UserError


def split_items(
    items: list[ImageItem],
    n_calib: int,
    n_heldout: int,
    seed: int = 0,
    calib_items: list[ImageItem] | None = None,
) -> tuple[list[ImageItem], list[ImageItem]]:
    """Return (calibration, held-out), each sorted by id.

    Calibration comes from `calib_items` when given (another folder), else from `items`; held-out
    comes from what `items` has left. Fewer images than asked: all available are taken, and the
    caller records the real counts.
    """
    for what, n in (("calibration", n_calib), ("held-out", n_heldout)):
        if n <= 0:
            raise UserError(f"{what} image count must be positive, got {n}")
    source = items if calib_items is None else calib_items
    calib = _take(source, n_calib, random.Random(f"{seed}:calibration"))
    used_ids = {item.id for item in calib}
    used_paths = {_key(item.path) for item in calib}
    rest = [i for i in items if i.id not in used_ids and _key(i.path) not in used_paths]
    heldout = _take(rest, n_heldout, random.Random(f"{seed}:heldout"))
    return calib, heldout


def check_disjoint_content(calib: list[ImageItem], heldout: list[ImageItem]) -> None:
    """Refuse, in one line, a held-out image whose bytes equal a calibration image's (a copy or
    a hard link under another name or folder). Only files whose size matches a calibration
    file's are hashed, so the check reads almost nothing when the sets share no content."""
    sizes: dict[int, list[ImageItem]] = defaultdict(list)
    for item in calib:
        sizes[_size(item.path)].append(item)
    hashed: dict[str, ImageItem] = {}  # content hash -> calibration item, filled as needed
    done: set[int] = set()  # sizes whose calibration files are hashed
    for item in heldout:
        size = _size(item.path)
        if size not in sizes:
            continue
        if size not in done:
            hashed |= {_sha256(twin.path): twin for twin in sizes[size]}
            done.add(size)
        twin = hashed.get(_sha256(item.path))
        if twin is not None:
            raise UserError(
                f"held-out image {item.path} has the same content as calibration image "
                f"{twin.path}: a held-out image the model was calibrated on flatters the FP8 "
                "engine; remove the copy from one of the folders"
            )


def _size(path: Path) -> int:
    return Path(path).stat().st_size


def _sha256(path: Path) -> str:
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stream_order(items: list[ImageItem], seed: int) -> list[ImageItem]:
    """`items` in a seeded random order, for a study that looks at them in rounds: the
    confidence sequences (`decision/sequential.py`) assume the images come in random order,
    and id order is class order in an ImageNet folder."""
    ordered = sorted(items, key=lambda item: item.id)
    random.Random(f"{seed}:stream").shuffle(ordered)
    return ordered


def ids_sha256(ids: list[str]) -> str:
    """The hash a record keeps of an image set's sorted ids: what every reader checks them by."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


def summarize_set(
    role: Literal["calibration", "heldout"],
    folder: str | Path,
    items: list[ImageItem],
    labelled: bool,
) -> ImageSet:
    """The record of one set: sorted ids, their hash, and per-class counts when labelled."""
    ids = sorted(item.id for item in items)
    counts = Counter(item.label for item in items) if labelled else Counter()
    return ImageSet(
        role=role,
        folder=str(folder),
        labelled=labelled,
        n_images=len(ids),
        n_classes=len(counts) if labelled else None,
        per_class_min=min(counts.values()) if counts else None,
        per_class_max=max(counts.values()) if counts else None,
        ids_sha256=ids_sha256(ids),
        ids=ids,
    )


def _take(items: list[ImageItem], n: int, rng: random.Random) -> list[ImageItem]:
    """Up to `n` items: round-robin over shuffled classes when labelled, else a random sample."""
    ordered = sorted(items, key=lambda item: item.id)  # input order must not matter
    if any(item.label is None for item in ordered):
        rng.shuffle(ordered)
        return sorted(ordered[:n], key=lambda item: item.id)
    by_class: dict[int, list[ImageItem]] = defaultdict(list)
    for item in ordered:
        assert item.label is not None  # unlabelled sets were drawn above
        by_class[item.label].append(item)
    for members in by_class.values():
        rng.shuffle(members)
    classes = sorted(by_class)
    rng.shuffle(classes)
    chosen: list[ImageItem] = []
    depth = 0
    while len(chosen) < n and len(chosen) < len(ordered):
        chosen += [by_class[c][depth] for c in classes if depth < len(by_class[c])]
        depth += 1
    return sorted(chosen[:n], key=lambda item: item.id)


def _key(path: Path) -> str:
    return str(Path(path).resolve())
