"""The installed quantstudy's version, as records and reports name it.

Read from the package metadata, so pyproject.toml stays the one place the number is written,
and kept here on the ground floor so that stages can name it without importing the package
root (which sits above every stage).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("quantstudy")
except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed: say so
    __version__ = "0+unknown"
