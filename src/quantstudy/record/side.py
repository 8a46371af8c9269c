"""Side files of a study: per-image lists kept beside study.json, sealed by the record.

A study's per-image results grow with its held-out images (50,000 at ImageNet scale), so they
live in a file of their own beside study.json and the record keeps only that file's name,
size and SHA-256 (`SideFile`): the record's digest covers the hash, so a side file changed
after the study no longer matches its record, and `record/io.py: read_side_file` refuses
it in one line.
"""

from __future__ import annotations

from quantstudy.record.base import Section

PER_IMAGE_FILE = "per-image.pt"  # the held-out pass's per-image rows and image ids


class SideFile(Section):
    """A file beside study.json that the record seals."""

    path: str  # relative to the study folder
    sha256: str
    images: int  # per-image entries it holds
