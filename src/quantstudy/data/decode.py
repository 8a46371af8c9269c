"""Decode any image Pillow opens into the 8-bit RGB a classifier was trained on.

`to_rgb` is the one conversion every image goes through (at scan time, to decide whether an
image is usable, and at load time): Pillow's own `convert("RGB")` silently gets some modes
wrong, so each is handled here:

- EXIF orientation is applied, so the model sees the picture as a viewer shows it;
- 16-bit grey (`I;16*`) is scaled to 8 bits (`convert` would clip everything above 255 to white);
- 32-bit integer and float pixels (`I`, `F`) have no defined range: refused with the reason;
- transparent pixels (an alpha channel, or a palette/`tRNS` transparency) are composited over
  white, as a page shows them (`convert` would keep whatever colour hides under them);
- every other mode Pillow opens (1, L, P, RGB, CMYK, YCbCr, LAB, HSV, ...) converts directly.

No torch here: the folder scan uses it before anything heavy is imported.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageOps

BACKGROUND = (255, 255, 255)  # under transparent pixels
SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
NO_RANGE = {"I": "32-bit integer", "F": "32-bit float"}
ALPHA = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})


class UnusableImage(ValueError):
    """An image that decodes but has no faithful 8-bit RGB form; the message says why."""


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB (see the module docstring), or `UnusableImage`."""
    image = ImageOps.exif_transpose(image) or image
    if image.mode in NO_RANGE:
        raise UnusableImage(
            f"mode {image.mode} ({NO_RANGE[image.mode]} pixels) has no defined 8-bit range; "
            "save it with 8 or 16 bits per channel"
        )
    if image.mode in SIXTEEN_BIT:
        grey = np.asarray(image).astype(np.uint32)
        image = Image.fromarray(((grey * 255 + 32767) // 65535).astype(np.uint8))
    if image.mode in ALPHA or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKGROUND, 255)), rgba)
    return image.convert("RGB")


def usable_cores() -> int:
    """The CPUs this process may run on (the machine's where the OS cannot say): how many
    decoders can run side by side."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
