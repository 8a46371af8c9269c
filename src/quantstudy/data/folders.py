"""Scan an image folder into labelled or unlabelled items, decoding every image once.

Labels come from a class list (one wnid a line, line number = label index), never from the
folders that happen to be present: a subset folder with 725 of 1000 classes must still give the
label indices the model was trained with. Bad files are recorded, not silently dropped, so the
study can say how many images it did not use and why.
"""

from __future__ import annotations

import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from quantstudy.data.decode import UnusableImage, to_rgb, usable_cores
from quantstudy.record import SkippedImage
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file, read_text

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
)


@dataclass(frozen=True)
class ImageItem:
    id: str  # posix path relative to the scanned root
    path: Path
    label: int | None
    wnid: str | None


@dataclass
class FolderScan:
    root: Path
    items: list[ImageItem]
    labelled: bool
    class_list: Path | None  # None: timm's ImageNet-1k wnids
    skipped: list[SkippedImage]
    n_classes: int | None = None  # length of the class list (labelled folders)


def scan_folder(root: Path, class_list: Path | None = None) -> FolderScan:
    """Scan `root`: `<wnid>/<image>` folders give labelled items, a flat folder unlabelled ones."""
    root = Path(root).expanduser()
    if not root.exists():
        raise UserError(f"data folder {root} does not exist; pass an existing folder of images")
    if not root.is_dir():
        raise UserError(f"data path {root} is not a folder; pass a folder of images")
    subfolders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    # every other entry, special files too: each is used or skipped with its reason, never
    # dropped unsaid
    files = sorted(p for p in root.iterdir() if not p.is_dir())
    candidates: list[tuple[Path, int | None, str | None]] = []
    skipped: list[SkippedImage] = []
    wnids: list[str] = []
    if subfolders:
        wnids = read_class_list(class_list)
        index = {wnid: i for i, wnid in enumerate(wnids)}
        _check_subfolders(subfolders, index, class_list)
        skipped += [_skip(root, p, "file outside the class folders") for p in files]
        for folder in subfolders:
            label = index[folder.name]
            candidates += [(path, label, folder.name) for path in sorted(folder.iterdir())]
    else:
        candidates = [(path, None, None) for path in files]
    items = _usable(root, candidates, skipped)
    if not items:
        reasons = ""
        if skipped:
            first = skipped[0]
            reasons = f" ({len(skipped)} files skipped, e.g. {first.id}: {first.reason})"
        raise UserError(
            f"no usable image in {root}{reasons}; pass a folder of images or of <wnid>/<image> "
            f"class folders"
        )
    items.sort(key=lambda item: item.id)
    skipped.sort(key=lambda s: s.id)
    return FolderScan(
        root=root,
        items=items,
        labelled=bool(subfolders),
        class_list=Path(class_list) if class_list is not None else None,
        skipped=skipped,
        n_classes=len(wnids) if subfolders else None,
    )


def read_class_list(class_list: Path | None = None) -> list[str]:
    """The wnids in label order: from `class_list`, or timm's ImageNet-1k synsets when None."""
    if class_list is None:
        import timm.data  # here, not at the top: a given class list needs no timm (seconds)

        return list(timm.data.ImageNetInfo().label_names())
    path = Path(class_list).expanduser()
    if not_a_file(path) == "missing":  # a pipe or a folder: refused by `read_text`, unopened
        raise UserError(f"class list {path} does not exist; pass a file with one wnid a line")
    # a byte-order mark is not part of a wnid
    text = read_text(path, "class list", "class list", bom=True)
    wnids = [line.strip() for line in text.rstrip("\n").splitlines()]
    if wnids and all(_WNID_LINE.match(w) for w in wnids if w):
        wnids = [w.split()[0] if w else w for w in wnids]  # "n01440764 tench, Tinca tinca"
    if not wnids or "" in wnids:
        line = wnids.index("") + 1 if "" in wnids else 1
        raise UserError(f"class list {path}: empty line {line}; write one wnid a line, no gaps")
    seen: set[str] = set()
    for i, wnid in enumerate(wnids):
        if wnid in seen:
            raise UserError(f"class list {path}: {wnid!r} repeated on line {i + 1}")
        seen.add(wnid)
    return wnids


_WNID_LINE = re.compile(r"^n\d{8}(\s|$)")  # a WordNet id, optionally followed by its name


def _check_subfolders(
    subfolders: list[Path], index: dict[str, int], class_list: Path | None
) -> None:
    unknown = [p.name for p in subfolders if p.name not in index]
    if unknown:
        source = str(class_list) if class_list is not None else "timm's ImageNet-1k class list"
        raise UserError(
            f"subfolder {unknown[0]!r} ({len(unknown)} unknown in all) is not a class in "
            f"{source}; pass --class-list FILE naming every class folder, remove the folder, or "
            f"put images directly in the data folder for an unlabelled study"
        )


def _usable(
    root: Path, candidates: list[tuple[Path, int | None, str | None]], skipped: list[SkippedImage]
) -> list[ImageItem]:
    """The candidates that are images which decode; the others go to `skipped` with the reason.
    Every image is decoded in full, by a pool of threads (Pillow's decoders release the GIL):
    on one thread, decoding a large folder held up every study before any model work began
    (docs/results.md, "Scale"). At most 16
    threads: each holds one decoded image, which for a large photo is tens of megabytes."""
    images = []
    for path, label, wnid in candidates:
        special = _not_regular(path)
        if path.is_dir():
            skipped.append(_skip(root, path, "folder inside a class folder (not scanned)"))
        elif special:
            skipped.append(_skip(root, path, f"not a regular file ({special}): not opened"))
        elif path.suffix.lower() not in IMAGE_SUFFIXES:
            reason = f"not an image file (suffix {path.suffix or 'none'!r})"
            skipped.append(_skip(root, path, reason))
        else:
            images.append((path, label, wnid))
    # Pillow warns (once per open, so again at load time) of an image above its decompression
    # -bomb limit and refuses one above twice that: both are skipped here with that reason,
    # said once in the skipped-files line. The filter is set around the pool, in this thread:
    # the worker threads read it, and nothing else changes it meanwhile.
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with ThreadPoolExecutor(max_workers=min(16, usable_cores())) as pool:
            problems = list(pool.map(_decode_problem, [path for path, _, _ in images]))
    items = []
    for (path, label, wnid), problem in zip(images, problems, strict=True):
        if problem:
            skipped.append(_skip(root, path, problem))
        else:
            items.append(ImageItem(_rel(root, path), path, label, wnid))
    return items


def _not_regular(path: Path) -> str | None:
    """What `path` is when it is neither a regular file nor a folder (through symbolic links),
    else None; never opened (`record/readers.py: not_a_file`)."""
    kind = not_a_file(path)
    return None if kind in (None, "a folder") else kind


def _decode_problem(path: Path) -> str | None:
    """Decode the whole image; return why it cannot be used, or None."""
    try:
        with Image.open(path) as image:
            image.load()
            to_rgb(image)
    except UnusableImage as e:
        return f"unusable image: {e}"
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        limit = (Image.MAX_IMAGE_PIXELS or 0) / 1e6
        return f"over {limit:.0f} million pixels (Pillow's decompression-bomb limit); resize it"
    except (OSError, SyntaxError, ValueError) as e:
        return f"cannot decode image: {type(e).__name__}: {e}"
    return None


def _skip(root: Path, path: Path, reason: str) -> SkippedImage:
    return SkippedImage(id=_rel(root, path), reason=reason)


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()
