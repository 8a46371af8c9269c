"""The trip back: each job's folder as one archive, bundled into the few files a call returns,
and the way back into folders here."""

from __future__ import annotations

import fnmatch
import os
import shutil
import tarfile
from pathlib import Path

from batch_jobs import NAME, JobsError
from batch_runner import Job

FILE_LIMIT = 16 * 2**20  # bytes a returned file may hold
MAX_FILES = 8  # files a call returns: batch.json and the bundles
BUNDLE_ROOM = FILE_LIMIT - 2**16  # a bundle's members, leaving room for tar's headers and end


def pack(jobs: list[Job], work: Path, out: Path) -> list[str]:
    """Each job's folder as one `NAME.tar.gz` (its `skip` names left out), bundled into at most
    `MAX_FILES - 1` `jobs-K.tar` in --out of at most `FILE_LIMIT` bytes each, biggest first;
    a folder that fits no bundle is not returned, and its job's `pack` says why. Returns the
    bundles' names."""
    staged = work / "packed"
    staged.mkdir(parents=True, exist_ok=True)
    archives = []
    for job in jobs:
        folder = work / "jobs" / job.spec.name
        if folder.is_dir():
            archive = staged / f"{job.spec.name}.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(folder, arcname=".", filter=_skipping(job.spec.skip))
            archives.append((job, archive, archive.stat().st_size))
    bundles: list[list[Path]] = []
    room: list[int] = []
    for job, archive, size in sorted(archives, key=lambda a: -a[2]):
        k = next((i for i, r in enumerate(room) if size <= r), None)
        if k is None and len(bundles) < MAX_FILES - 1 and size <= BUNDLE_ROOM:
            bundles.append([])
            room.append(BUNDLE_ROOM)
            k = len(bundles) - 1
        if k is None:
            job.pack = (
                f"not returned: {size / 2**20:.1f} MiB packed, no room in the "
                f"{MAX_FILES - 1} files of {FILE_LIMIT // 2**20} MiB"
            )
            continue
        bundles[k].append(archive)
        room[k] -= size + 1024  # its tar header and padding
        job.pack = f"jobs-{k + 1}.tar"
    names = []
    for k, members in enumerate(bundles, 1):
        tmp = out / f".jobs-{k}.tar.tmp"
        with tarfile.open(tmp, "w") as tar:
            for archive in members:
                tar.add(archive, arcname=archive.name)
        os.replace(tmp, out / f"jobs-{k}.tar")
        names.append(f"jobs-{k}.tar")
    return names


def _skipping(patterns: tuple[str, ...]):
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if any(fnmatch.fnmatch(p, pat) for p in parts for pat in patterns) else info

    return keep


def unpack(files: list[Path], into: Path) -> list[Path]:
    """Each job's folder of the bundles `files` as `into/NAME` (batch.json copied beside them).
    Everything is checked before anything is written: a file that is no bundle, or a folder
    already in `into` (never mixed with what it holds), is refused in one line."""
    bundles = [p for p in files if not p.name.endswith(".json")]
    members: list[tuple[Path, str]] = []
    for path in bundles:
        if not path.is_file() or not tarfile.is_tarfile(path):
            raise JobsError(f"{path} is no bundle of batch.py (jobs-K.tar) nor its batch.json")
        with tarfile.open(path) as bundle:
            for member in bundle.getmembers():
                name = member.name.removesuffix(".tar.gz")
                if not member.isfile() or not NAME.fullmatch(name) or name == member.name:
                    raise JobsError(f"{path} holds {member.name!r}, not a job's NAME.tar.gz")
                if (into / name).exists() or name in [n for _, n in members]:
                    raise JobsError(f"{into / name} exists or comes twice: give another --into")
                members.append((path, member.name))
    into.mkdir(parents=True, exist_ok=True)
    for path in files:
        if path not in bundles:
            shutil.copyfile(path, into / path.name)
    restored = []
    for path, member_name in members:
        with tarfile.open(path) as bundle:
            inner = bundle.extractfile(member_name)
            assert inner is not None
            target = into / member_name.removesuffix(".tar.gz")
            with tarfile.open(fileobj=inner, mode="r:gz") as tar:
                tar.extractall(target, filter="data")
        restored.append(target)
    return restored
