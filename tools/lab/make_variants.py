"""Deterministic crop/flip variants of an ImageNet-style folder, for throughput and memory only.

    python tools/lab/make_variants.py ../shared/data/imagenet/val-1300 /tmp/variants --count 50000

Writes `<wnid>/<stem>_v<k>.jpg` under the output folder, cycling over the source images and,
for each pass, the next variant (a crop at one of three sizes and nine positions, mirrored or
not: 54 per photo), until `--count` images exist; labels are kept by the class folders. The
same arguments give the same files, byte for byte (fixed JPEG quality, sorted sources).

Variants of one photo are not independent evidence: these folders measure how a study scales
(`tools/lab/bench/scale.py`), never whether FP8 pays for a model.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
from pathlib import Path

from PIL import Image, ImageOps

CROPS = (0.80, 0.88, 0.95)  # side of the crop as a share of the shorter side
POSITIONS = tuple(itertools.product((0.0, 0.5, 1.0), repeat=2))  # (x, y) of the crop's slack
VARIANTS = tuple(itertools.product(CROPS, POSITIONS, (False, True)))
SUFFIXES = {".jpg", ".jpeg", ".png", ".jpe"}
QUALITY = 90


def variant(image: Image.Image, k: int) -> Image.Image:
    """The k-th variant of `image` (k modulo the 54 variants)."""
    share, (fx, fy), mirror = VARIANTS[k % len(VARIANTS)]
    w, h = image.size
    side = max(1, round(min(w, h) * share))
    left, top = round((w - side) * fx), round((h - side) * fy)
    out = image.crop((left, top, left + side, top + side))
    return ImageOps.mirror(out) if mirror else out


def sources(root: Path) -> list[Path]:
    """The source images, sorted: `<wnid>/<image>` files, or the files of a flat folder."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise SystemExit(f"no images under {root}")
    return files


def plan(root: Path, out: Path, count: int) -> list[tuple[Path, Path, int]]:
    """(source, target, variant) of the `count` images to write, in a fixed order."""
    files = sources(root)
    if count > len(files) * len(VARIANTS):
        raise SystemExit(f"{len(files)} images x {len(VARIANTS)} variants < {count} asked")
    jobs = []
    for k in range(len(VARIANTS)):
        for path in files:
            if len(jobs) == count:
                return jobs
            target = out / path.relative_to(root).parent / f"{path.stem}_v{k}.jpg"
            jobs.append((path, target, k))
    return jobs


def write_one(job: tuple[Path, Path, int]) -> None:
    source, target, k = job
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(source) as image:
        variant(image.convert("RGB"), k).save(target, quality=QUALITY)


def make(root: Path, out: Path, count: int, workers: int = 1) -> int:
    """Write `count` variants of the images under `root` into `out`; returns files written."""
    jobs = plan(root, out, count)
    if workers > 1:
        with multiprocessing.Pool(workers) as pool:
            pool.map(write_one, jobs, chunksize=64)
    else:
        for job in jobs:
            write_one(job)
    return len(jobs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="ImageNet-style folder (<wnid>/<image>) or flat")
    p.add_argument("out", type=Path, help="folder to write the variants into")
    p.add_argument("--count", type=int, required=True, help="images to write")
    p.add_argument("--workers", type=int, default=1, help="processes writing (default 1)")
    a = p.parse_args(argv)
    n = make(a.source, a.out, a.count, a.workers)
    print(f"{n} variant images in {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
