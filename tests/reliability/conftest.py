"""The reliability suite's shared files: a tiny workspace and one finished study.

The workspace holds what a user would bring: a class list (with a byte-order mark and the
`wnid name` lines of ImageNet's LOC_synset_mapping.txt), an ImageNet-style folder whose images
come in every colour mode Pillow reads (and a few files that must be skipped, with their
reason), and nothing else. One study of it runs once per session; cases that need a finished
study copy its folder, so most of them fail fast, before any heavy work.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import timm.data
from PIL import Image

from tests.reliability._drive import WNIDS, Result, assert_finished, quantstudy, study_args

SIZE = 40


def _pixels(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)


def _exif_rotated(seed: int) -> bytes:
    """A JPEG whose EXIF says 'rotate 90 degrees' (orientation 6), as phones write them."""
    image = Image.fromarray(_pixels(seed)[:, : SIZE // 2])
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    image.save(buf, "JPEG", exif=exif)
    return buf.getvalue()


def pillow_reads_raw_ycbcr_tiff() -> bool:
    """Whether the installed Pillow reads back an uncompressed YCbCr TIFF it wrote (13 and later,
    in mode YCbCr); Pillow 11 and 12 fail on it ("image file is truncated")."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).convert("YCbCr").save(buf, "TIFF")
    try:
        Image.open(io.BytesIO(buf.getvalue())).load()
    except OSError:
        return False
    return True


def write_images(folder: Path) -> None:
    """Class 0: one image per colour mode, and two that have no faithful RGB form; class 1:
    plain RGB images, a truncated PNG, a text file, and a named pipe and a broken link named
    like images (the pipe would block whoever opened it: the scan must not)."""
    a, b = folder / WNIDS[0], folder / WNIDS[1]
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    rgb = Image.fromarray(_pixels(0))
    rgb.save(a / "rgb.png")
    rgb.convert("L").save(a / "grey.png")
    rgb.convert("P").save(a / "palette.png")
    rgb.convert("LA").save(a / "grey_alpha.png")
    rgb.convert("RGBA").save(a / "rgba.png")
    rgb.convert("1").save(a / "bits.png")
    grey16 = (np.random.default_rng(1).random((SIZE, SIZE)) * 65535).astype(np.uint16)
    Image.fromarray(grey16).save(a / "grey16.png")
    rgb.convert("CMYK").save(a / "cmyk.jpg")
    # raw where Pillow reads it (the YCbCr mode this file is for), else LZW, which every
    # supported Pillow decodes (libtiff converts it to RGB): the study's counts hold either way
    compression = "raw" if pillow_reads_raw_ycbcr_tiff() else "tiff_lzw"
    rgb.convert("YCbCr").save(a / "ycbcr.tif", compression=compression)
    (a / "exif.jpg").write_bytes(_exif_rotated(2))
    Image.fromarray(np.random.default_rng(3).random((SIZE, SIZE)).astype(np.float32)).save(
        a / "float.tif"
    )
    Image.fromarray(np.arange(SIZE * SIZE, dtype=np.int32).reshape(SIZE, SIZE)).save(
        a / "int32.tif"
    )
    for i in range(6):
        Image.fromarray(_pixels(10 + i)).save(b / f"img{i}.png")
    whole = (b / "img0.png").read_bytes()
    (b / "truncated.png").write_bytes(whole[: len(whole) // 2])
    (b / "notes.txt").write_text("not an image\n")
    os.mkfifo(b / "pipe.png")
    (b / "gone.jpg").symlink_to("moved-away.jpg")


USABLE = 16  # 10 in class 0, 6 in class 1
SKIPPED = {
    f"{WNIDS[0]}/float.tif": "no defined 8-bit range",
    f"{WNIDS[0]}/int32.tif": "no defined 8-bit range",
    f"{WNIDS[1]}/truncated.png": "cannot decode",
    f"{WNIDS[1]}/notes.txt": "not an image",
    f"{WNIDS[1]}/pipe.png": "not a regular file (a named pipe)",
    f"{WNIDS[1]}/gone.jpg": "not a regular file (a broken symbolic link)",
}


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reliability")
    info = timm.data.ImageNetInfo()
    lines = [f"{w} {info.label_name_to_description(w)}" for w in info.label_names()]
    (root / "classes.txt").write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    write_images(root / "data")
    return root


@pytest.fixture(scope="session")
def finished(workspace) -> tuple[Path, Result]:
    """The one full study of the session, and what its run printed."""
    result = quantstudy(*study_args("study"), cwd=workspace)
    assert_finished(result)
    return workspace / "study", result


@pytest.fixture(scope="session")
def study(finished) -> Path:
    return finished[0]
