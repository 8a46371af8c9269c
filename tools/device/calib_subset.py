"""Print the images of a calibration folder that a study of `--calib N` takes, one path a line
relative to the folder, sorted.

`carry.sh` carries these alone when the whole folder does not fit a device call (calib-1000 is
24 MB; val-1300 and the wheels leave about 15 MB of the 64 MiB): a study of `--calib N` (seed 0)
then takes from the carried folder exactly the images it takes from the whole one, because the
split (`quantstudy.data.split`) takes every image of a folder that holds no more than it asks
for. The data tests calibrate on 500 of calib-1000 (`tests/data`), so on the device they compute
what they compute on the whole folder; a test that asks for fewer takes its images from the 500,
which are other images than the whole folder would give it.

    PYTHONPATH=src python tools/device/calib_subset.py ../shared/data/imagenet/calib-1000 500
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quantstudy.data.folders import scan_folder
from quantstudy.data.split import split_items


def calibration_subset(
    folder: Path, n: int, seed: int = 0, classes: Path | None = None
) -> list[Path]:
    """The paths (relative to `folder`) of the `n` images a study of seed `seed` calibrates on."""
    scan = scan_folder(folder, classes)
    calib, _ = split_items([], n, 1, seed, calib_items=scan.items)  # no held-out folder here
    return sorted(Path(item.path).relative_to(scan.root) for item in calib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--class-list", type=Path, help="default: the folder's ../classes.txt")
    opts = parser.parse_args()
    classes = opts.class_list or opts.folder.parent / "classes.txt"
    classes = classes if classes.is_file() else None  # then timm's ImageNet classes
    subset = calibration_subset(opts.folder, opts.n, opts.seed, classes)
    print("\n".join(map(str, subset)))


if __name__ == "__main__":
    main()
