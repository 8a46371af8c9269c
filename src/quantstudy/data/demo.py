"""Real labelled images for `quantstudy demo`, with no data set to download by hand.

The shared ImageNet subsets are used when present. Otherwise the 20 ImageNet images inside the
foolbox 3.3.4 wheel on PyPI are unpacked into an ImageNet-style folder (read from the zip, foolbox
is never imported). Twenty images are enough to show the pipeline, not to judge a model.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from quantstudy.data.folders import read_class_list
from quantstudy.record.errors import UserError

SHARED_ENV = "QUANTSTUDY_SHARED_DATA"
NO_SHARED = "none"  # $QUANTSTUDY_SHARED_DATA=none: the foolbox images, wherever the shared data is
WHEEL_ENV = "QUANTSTUDY_FOOLBOX_WHEEL"
FOOLBOX = "foolbox==3.3.4"
_WHEEL_GLOB = "foolbox-3.3.4-*.whl"
_MEMBER = re.compile(r"^foolbox/data/(imagenet_(\d+)_(\d+))\.jpg$")
_FOLDER = "foolbox-imagenet-20"


@dataclass
class DemoData:
    data_dir: Path
    calib_dir: Path | None
    class_list: Path | None
    description: str
    # Split sizes that fit the data (None: the study's defaults); 20 images cannot give 500 + 1500.
    calib: int | None = None
    heldout: int | None = None


def demo_data(cache_dir: Path | None = None) -> DemoData:
    """The shared ImageNet subsets when found, else the foolbox images (fetched once, cached)."""
    shared = find_shared_data()
    if shared is not None:
        classes = shared / "classes.txt"
        return DemoData(
            data_dir=shared / "val-1300",
            calib_dir=shared / "calib-1000",
            class_list=classes if classes.is_file() else None,
            description=f"shared ImageNet subsets in {shared}: held-out from val-1300, "
            f"calibration from calib-1000",
        )
    return foolbox_demo(cache_dir or Path.home() / ".cache" / "quantstudy")


def find_shared_data() -> Path | None:
    """$QUANTSTUDY_SHARED_DATA, else `<repo root>/../shared/data/imagenet`; None when absent,
    or when the variable says `none` (the foolbox images even beside the shared data: CI's demo
    step, which must be cheap and the same on every machine)."""
    configured = os.environ.get(SHARED_ENV)
    if configured == NO_SHARED:
        return None
    if configured:
        path = Path(configured).expanduser()
        if not (path / "val-1300").is_dir():
            raise UserError(
                f"{SHARED_ENV}={configured} has no val-1300 folder; point it at the folder "
                f"holding val-1300/ and calib-1000/, or unset it"
            )
        return path
    root = _repo_root()
    if root is not None:
        path = root.parent / "shared" / "data" / "imagenet"
        if (path / "val-1300").is_dir():
            return path
    return None


def foolbox_demo(cache_dir: Path) -> DemoData:
    """Unpack the foolbox wheel's 20 ImageNet images into `<cache_dir>/foolbox-imagenet-20`."""
    target = cache_dir / _FOLDER
    if not target.is_dir():
        _unpack(_wheel(cache_dir), target)
    return DemoData(
        data_dir=target,
        calib_dir=None,
        class_list=None,
        description=f"20 labelled ImageNet images from the {FOOLBOX} wheel on PyPI, in {target} "
        f"(split 5 for calibration, 15 held out; a pipeline demo, not a quality verdict)",
        calib=5,
        heldout=15,
    )


def _wheel(cache_dir: Path) -> Path:
    configured = os.environ.get(WHEEL_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise UserError(f"{WHEEL_ENV}={configured} is not a file; point it at the wheel")
        return path
    found = sorted(cache_dir.glob(_WHEEL_GLOB))
    if found:
        return found[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", FOOLBOX, "--no-deps", "-d", str(cache_dir)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache_dir.glob(_WHEEL_GLOB))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UserError(
            f"could not fetch the demo images ({' '.join(command)} failed: {' / '.join(tail)}). "
            f"Without network, download {FOOLBOX} elsewhere and set {WHEEL_ENV}=/path/to/wheel, "
            f"or pass --data FOLDER with your own images"
        )
    return found[0]


def _unpack(wheel: Path, target: Path) -> None:
    """Write `<wnid>/<name>.jpg` into a temporary folder, then rename it into place."""
    wnids = read_class_list(None)
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise UserError(f"{wheel} is not a readable wheel ({e}); delete it and retry") from e
    with archive:
        members = [(m, match) for m in archive.namelist() if (match := _MEMBER.match(m))]
        if not members:
            raise UserError(f"{wheel} holds no foolbox/data/imagenet_*.jpg; is it {FOOLBOX}?")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for member, match in members:
                folder = staging / wnids[int(match.group(3))]
                folder.mkdir(exist_ok=True)
                (folder / f"{match.group(1)}.jpg").write_bytes(archive.read(member))
            if target.is_dir():  # another process unpacked it meanwhile
                shutil.rmtree(staging)
            else:
                os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _repo_root() -> Path | None:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    return None
