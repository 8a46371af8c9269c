"""Class 1, images: every mode Pillow opens becomes the RGB a viewer would show, or is refused
with its reason (the CLI cases check that the study uses or skips them; these check how)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from quantstudy.data.decode import UnusableImage, to_rgb
from tests.reliability.conftest import pillow_reads_raw_ycbcr_tiff

RED = (200, 30, 40)


def _roundtrip(image: Image.Image, fmt: str) -> Image.Image:
    buf = io.BytesIO()
    image.save(buf, fmt)
    buf.seek(0)
    return Image.open(buf)


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("RGB", "PNG"), ("P", "PNG"), ("CMYK", "TIFF"), ("YCbCr", "TIFF"), ("LAB", "TIFF")],
)
def test_colour_modes_keep_their_colour(mode, fmt):
    rgb = Image.new("RGB", (8, 8), RED)
    image = rgb.quantize() if mode == "P" else rgb.convert(mode)
    # what is under test is the conversion of each mode: where Pillow cannot read back the raw
    # YCbCr TIFF it writes, the YCbCr image is taken as Pillow holds it in memory
    if mode != "YCbCr" or pillow_reads_raw_ycbcr_tiff():
        image = _roundtrip(image, fmt)
    assert image.mode == mode
    pixel = np.asarray(to_rgb(image))[0, 0].astype(int)
    assert np.abs(pixel - RED).max() <= 6, pixel


def test_sixteen_bit_grey_is_scaled_not_clipped():
    grey = np.full((4, 4), 32768, dtype=np.uint16)  # mid grey in 16 bits
    image = _roundtrip(Image.fromarray(grey), "PNG")
    assert image.mode.startswith("I;16")
    assert np.asarray(to_rgb(image))[0, 0].tolist() == [128, 128, 128]


@pytest.mark.parametrize("mode", ["LA", "RGBA", "PA"])
def test_transparent_pixels_are_white(mode):
    image = Image.new("RGBA", (4, 4), (*RED, 0)).convert(mode)
    assert image.mode == mode
    assert np.asarray(to_rgb(image))[0, 0].tolist() == [255, 255, 255]


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (6, 2), RED)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when shown
    buf = io.BytesIO()
    image.save(buf, "JPEG", exif=exif)
    buf.seek(0)
    assert to_rgb(Image.open(buf)).size == (2, 6)


@pytest.mark.parametrize("mode", ["I", "F"])
def test_pixels_without_a_range_are_refused(mode):
    image = Image.fromarray(np.zeros((4, 4), dtype=np.int32 if mode == "I" else np.float32))
    assert image.mode == mode
    with pytest.raises(UnusableImage, match="no defined 8-bit range"):
        to_rgb(image)
