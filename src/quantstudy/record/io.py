"""Atomic file writes, so an interrupted or failed study never leaves a half-written file.

Every write goes to a hidden temporary file beside its target and is renamed over it; on any
failure (a full disk, Ctrl-C) the temporary file is removed and the target keeps its previous
content. Files are created with mode 0666 less the umask, as `open()` would create them, so a
study folder is as readable to others as any other file the user writes.

A write that fails for a reason of the filesystem (no space, no permission, a path through a
file, a folder that cannot be created) raises `FilesystemError`: a `UserError` whose one line
names the path, the reason and the setting to change (--out, or the cache variable that placed
the path).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from quantstudy.record.errors import UserError
from quantstudy.record.side import SideFile
from quantstudy.record.study import StudyRecord, record_digest

TMP_SUFFIX = ".tmp"  # temporary files are `.<name>.<random>.tmp` beside their target

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_A_FOLDER = {errno.EEXIST, errno.ENOTDIR, errno.EISDIR}
# A folder that cannot be created although its parent exists: a virtual filesystem (/proc), or a
# folder removed while the study ran.
_CANNOT_CREATE = {errno.ENOENT}
FILESYSTEM_ERRNOS = frozenset(
    _NO_SPACE | _NO_PERMISSION | _NOT_A_FOLDER | _CANNOT_CREATE | {errno.EIO}
)
# The environment variables that place the caches a study writes outside its --out folder
# (`study/calib_stats.py`, `sweep/caches.py`, Inductor and Triton); a fault below one of them is
# fixed by changing that variable, not --out. `~/.cache/quantstudy` is their default root.
CACHE_SETTINGS = (
    "QUANTSTUDY_CALIB_STATS_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "QUANTSTUDY_CACHE_DIR",
)


def beside_inductor_cache() -> Path:
    """The folder that holds Inductor's cache (`$TORCHINDUCTOR_CACHE_DIR`'s parent, by default
    `~/.cache/quantstudy`): the kernels' stored tuning choices and the engines' per-layer timings
    are kept there, so they move, and are emptied, with the compiled kernels they describe."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(root).parent if root else Path.home() / ".cache" / "quantstudy"


class FilesystemError(UserError):
    """A write the filesystem refused; the message names the path and the fix."""


# Folders a command rewrites in place that no option of it names (`report` and `decide` write
# into the study folder they are given): a fault there is fixed by the phrase kept here, not by
# an --out the command does not have. Set by `in_place`.
_IN_PLACE: ContextVar[tuple[Path, ...]] = ContextVar("in_place", default=())
IN_PLACE_FIX = "copy the study folder where you can write and give the command the copy"


@contextmanager
def in_place(folder: Path) -> Iterator[None]:
    """Within this block, a filesystem fault below `folder` says `IN_PLACE_FIX`, not --out."""
    token = _IN_PLACE.set((*_IN_PLACE.get(), Path(folder).absolute()))
    try:
        yield
    finally:
        _IN_PLACE.reset(token)


def _setting_of(path: Path | str) -> str:
    """What the user changes to move `path`: the cache variable whose folder holds it, the
    study folder a command rewrites in place (`in_place`), else --out (every other file the
    tool writes lies in the study or sweep folder)."""
    where = Path(path).absolute()
    if any(where == f or f in where.parents for f in _IN_PLACE.get()):
        return IN_PLACE_FIX
    for var in CACHE_SETTINGS:
        root = os.environ.get(var)
        if root and (where == Path(root).absolute() or Path(root).absolute() in where.parents):
            return f"${var}"
    default = Path.home() / ".cache" / "quantstudy"
    if where == default or default in where.parents:
        # Inductor's default folder there (`engines/builders.py`), and the kernel caches beside
        # it, follow $TORCHINDUCTOR_CACHE_DIR
        return "$TORCHINDUCTOR_CACHE_DIR"
    return "--out"


def filesystem_message(
    error: OSError, path: Path | str | None = None, verb: str = "write"
) -> str | None:
    """One line for a filesystem fault (path, reason and what to do), or None if `error` is not
    one. The fix names the setting that placed the path: --out, or a cache variable."""
    if error.errno not in FILESYSTEM_ERRNOS:
        return None
    where = error.filename or path or "?"
    reason = error.strerror or os.strerror(error.errno)
    setting = _setting_of(where) if where != "?" else "--out"
    other = f"set {setting} to another folder" if setting.startswith("$") else setting
    other = f"give another {setting}" if setting == "--out" else other
    if error.errno in _NO_SPACE:
        room = "raise the file size limit (ulimit -f)" if error.errno == errno.EFBIG else ""
        fix = (
            f"{room or 'free space there'} (or {other}) and rerun the same command "
            "to resume; finished stages are kept"
        )
    elif error.errno in _NO_PERMISSION:
        fix = other if setting == IN_PLACE_FIX else f"{other} you can write"
    elif error.errno in _NOT_A_FOLDER:
        fix = f"a path on the way is a file, or a folder where a file belongs; {other}"
    elif error.errno in _CANNOT_CREATE:
        fix = (
            "a folder on the way does not exist and cannot be created (a virtual filesystem "
            f"such as /proc, or a folder removed meanwhile); {other}"
        )
    else:
        fix = "the disk reported an I/O error; check it and rerun the same command to resume"
    return f"cannot {verb} {where}: {reason}; {fix}"


def make_folder(folder: Path) -> None:
    """`mkdir -p` that turns a filesystem refusal into a one-line `FilesystemError`."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        message = filesystem_message(e, folder)
        if message is None:
            raise
        raise FilesystemError(message) from None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    make_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0666 less the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        message = None
        if isinstance(e, OSError):  # named by its target: the temporary file is gone
            named = e if e.filename not in (str(tmp), tmp) else OSError(e.errno, e.strerror)
            message = filesystem_message(named, path)
        if message is None:
            raise
        raise FilesystemError(message) from None


def write_text_atomic(path: Path, text: str) -> None:
    """UTF-8 text twin of `write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON with sorted keys and a trailing newline, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_record(path: Path, record: StudyRecord) -> None:
    """Write a study record sealed with the digest of its measured sections (`record_digest`)."""
    data = record.model_dump(mode="json")
    data["digest"] = record_digest(data)
    write_json_atomic(path, data)


def write_side_file(folder: Path, name: str, data: bytes, images: int) -> SideFile:
    """Write `data` atomically as `folder/name`; the section the record keeps for it."""
    write_bytes_atomic(Path(folder) / name, data)
    return SideFile(path=name, sha256=hashlib.sha256(data).hexdigest(), images=images)


def read_side_file(folder: Path, side: SideFile) -> bytes:
    """The bytes of `side`, refused (one line) when missing or not what the record sealed."""
    path = Path(folder) / side.path
    if not path.is_file():
        raise UserError(f"{path} is missing: the study's per-image results are needed; rerun it")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != side.sha256:
        raise UserError(
            f"{path} does not match its study record (SHA-256 differs): it was changed after "
            "the study; rerun the study"
        )
    return data
