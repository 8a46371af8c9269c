"""Atomic file writes, so an interrupted or failed study never leaves a half-written file.

Every write goes to a hidden temporary file beside its target and is renamed over it; on any
failure (a full disk, Ctrl-C) the temporary file is removed and the target keeps its previous
content. Files are created with mode 0666 less the umask, as `open()` would create them, so a
study folder is as readable to others as any other file the user writes.

A write that fails for a reason of the filesystem (no space, no permission, a path through a
file) raises `FilesystemError`: a `UserError` whose one line names the path and what to do.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from quantstudy.record.errors import UserError
from quantstudy.record.side import SideFile
from quantstudy.record.study import StudyRecord, record_digest

TMP_SUFFIX = ".tmp"  # temporary files are `.<name>.<random>.tmp` beside their target

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_A_FOLDER = {errno.EEXIST, errno.ENOTDIR, errno.EISDIR}
FILESYSTEM_ERRNOS = frozenset(_NO_SPACE | _NO_PERMISSION | _NOT_A_FOLDER | {errno.EIO})


class FilesystemError(UserError):
    """A write the filesystem refused; the message names the path and the fix."""


def filesystem_message(error: OSError, path: Path | str | None = None) -> str | None:
    """One line for a filesystem fault (path and what to do), or None if `error` is not one."""
    if error.errno not in FILESYSTEM_ERRNOS:
        return None
    where = error.filename or path or "?"
    reason = error.strerror or os.strerror(error.errno)
    if error.errno in _NO_SPACE:
        room = "raise the file size limit (ulimit -f)" if error.errno == errno.EFBIG else ""
        fix = (
            f"{room or 'free space there'} (or give another --out) and rerun the same command "
            "to resume; finished stages are kept"
        )
    elif error.errno in _NO_PERMISSION:
        fix = "give a folder you can write with --out"
    elif error.errno in _NOT_A_FOLDER:
        fix = "a path on the way is a file, or a folder where a file belongs; give a new --out"
    else:
        fix = "the disk reported an I/O error; check it and rerun the same command to resume"
    return f"cannot write {where}: {reason}; {fix}"


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
        message = filesystem_message(e, path) if isinstance(e, OSError) else None
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
