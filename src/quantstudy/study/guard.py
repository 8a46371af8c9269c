"""Claim a study folder before the first write: one run at a time, and no finished study lost.

`preflight(config)` refuses, in about a second and before torch is imported, what needs no
model: a `--out` that is a file, or below a file, or in a folder that cannot be written, or in
use by another run; a data folder that does not exist; a class list, recipe or policy file whose
content is wrong; a lab switch set to a value its code does not take. The study checks all of it
again where it uses it.

`claim_study_folder(out_dir, record, force)` is called once a study knows its folder and its
config, before it writes anything there. It refuses, with one line:

- a `--out` that is a file;
- a folder another quantstudy process is writing (an exclusive lock, below);
- a folder holding a complete study of another configuration, unless `force` (then that
  study's record, report and plots are removed first, so no old report stays beside the new
  record).

The lock is `fcntl.flock` on `<out>/.lock`, held until the claim is released (or the process
ends, however it ends: the kernel drops the lock with the process, so a killed run leaves no
stale lock). `fcntl` rather than the `filelock` package: studies run on Linux GPU hosts, the
standard library's lock does exactly this in a few lines, and a lock that is not taken is
refused at once instead of waited for. With the lock held, temporary files a killed run left
behind are removed.
"""

from __future__ import annotations

import fcntl
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from quantstudy.data.folders import read_class_list
from quantstudy.decision.policy import load_policy
from quantstudy.quant import backends
from quantstudy.quant.kernels.switches import check_lab_switches
from quantstudy.recipe.builtin import load_recipe
from quantstudy.record import StudyConfig, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.io import (
    CACHE_SETTINGS,
    TMP_SUFFIX,
    FilesystemError,
    filesystem_message,
    in_place,
    make_folder,
)
from quantstudy.record.load import RECORD_FILE, schema_problem
from quantstudy.record.readers import not_a_file, read_json
from quantstudy.record.vocab import Device
from quantstudy.report.plots import PLOT_FILES
from quantstudy.report.render import REPORT_FILE

console = Console(stderr=True)

LOCK_FILE = ".lock"
CACHE_DIR = ".cache"
# Config fields that name where the study goes, not what it measures.
NOT_COMPARED = frozenset({"out"})


class StudyFolder:
    """A claimed study folder: holds its lock until `release()` (or the end of the process)."""

    def __init__(self, path: Path, lock: IO[str]) -> None:
        self.path = path
        self._lock: IO[str] | None = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor drops the flock
            self._lock = None

    def __enter__(self) -> StudyFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def preflight(config: StudyConfig) -> None:
    """The checks a study can make before loading anything heavy (module docstring)."""
    check_lab_switches()  # the record would name a junk value as in effect (Python API too)
    _check_package(config)
    if config.out is not None:
        _check_out(Path(config.out))
    _check_cache_settings()
    for option, folder in (("--data", config.data), ("--calib-data", config.calib_data)):
        kind = None if folder is None else not_a_file(Path(folder).expanduser())
        if folder is not None and kind != "a folder":
            what = "does not exist" if kind == "missing" else f"is {kind or 'a file'}"
            raise UserError(f"{option} {folder} {what}; pass a folder of images")
    _check_not_own_outputs(config)
    if config.class_list is not None:
        read_class_list(Path(config.class_list))
    if config.recipe is not None:
        load_recipe(config.recipe)
    load_policy(config.policy)
    if config.fp8_kernel is not None:
        backends.check_option(config.fp8_kernel)  # a --config file's, or a sweep point's


def _check_not_own_outputs(config: StudyConfig) -> None:
    """The tool never reads what it wrote: an image folder that is (or lies inside) a study
    folder would feed its plots to the model as images, and a --out inside an image folder
    would do the same on the next run."""
    out = Path(config.out).expanduser().resolve() if config.out is not None else None
    for option_name, folder in (("--data", config.data), ("--calib-data", config.calib_data)):
        if folder is None:
            continue
        images = Path(folder).expanduser().resolve()
        study = next((p for p in (images, *images.parents) if (p / RECORD_FILE).is_file()), None)
        if study is not None:
            raise UserError(
                f"{option_name} {folder} is or lies inside the study folder {study} (it holds "
                f"{RECORD_FILE}): a study's outputs are not images to study; pass the image folder"
            )
        if out is not None and (out == images or images in out.parents):
            raise UserError(
                f"--out {config.out} lies inside {option_name} {folder}: the study's plots "
                "would be read as images by the next study of that folder; give an --out "
                "outside it"
            )


def _check_package(config: StudyConfig) -> None:
    """`--package` builds the CUDA engines' packages beside their timings: with no timings, or
    on the CPU, it would be dropped unsaid. (A record keeps the flag as it was given, so this is
    a check of a new study, not of the config.)"""
    if config.package and not config.speed:
        raise UserError(
            "--package builds its packages beside the timings, and --no-speed times nothing; "
            "drop one of them"
        )
    if config.package and config.device != Device.CUDA:
        raise UserError(
            f"--package builds CUDA packages, and this study runs on the {config.device}; drop "
            "it, or package the CPU emulation afterwards: quantstudy package STUDY --device cpu"
        )


def _check_out(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file, not a folder; give a new folder for the study")
    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"--out {out_dir}: {existing} is a file, not a folder; give a new --out")
    _probe_write(existing, out_dir)
    if out_dir.is_dir() and (out_dir / LOCK_FILE).exists():
        _lock(out_dir).close()  # refuses at once while another run holds it


def check_batch_memory(config: StudyConfig, input_size: tuple[int, ...], memory: int) -> None:
    """Refuse timed batches whose fp32 input alone takes more than a quarter of `memory` (the
    bytes of the device the engines run on), before the model is calibrated or scored: the
    timing stage comes last, and the engines' activations need many times their input."""
    if not config.speed:
        return
    batch = max(config.batches)
    need = batch * math.prod(input_size) * 4
    if need * 4 > memory:
        fits = max(1, memory // (4 * 4 * math.prod(input_size)))
        raise UserError(
            f"--batches {batch}: its {'x'.join(map(str, input_size))} fp32 input alone is "
            f"{need / 2**30:.1f} GiB, over a quarter of the {memory / 2**30:.0f} GiB this "
            f"device holds; time batches of at most {fits} here"
        )


def device_memory(device: str) -> int:
    """Bytes of memory of the device the engines run on: the GPU's, or this machine's RAM."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _probe_write(existing: Path, out_dir: Path) -> None:
    """Create and remove an empty folder where `out_dir` will be made: the filesystem's own
    answer, which `os.access` does not give (root passes it on a read-only mount, and /proc
    refuses folders whatever the permission bits say)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".quantstudy-probe-", dir=existing))
    except OSError as e:
        message = filesystem_message(OSError(e.errno, e.strerror), out_dir)
        if message is None:
            raise
        raise FilesystemError(message) from None


def _check_cache_settings() -> None:
    """A cache variable naming a file (or a path below one), or a folder that cannot be
    written, is refused before any work, naming the variable: the study would fail at its first
    cache write, minutes in."""
    for var in CACHE_SETTINGS:
        root = os.environ.get(var)
        if not root:
            continue
        path = Path(root).expanduser().absolute()
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise UserError(
                f"${var}={root}: {existing} is a file, not a folder; set ${var} to a folder"
            )
        _probe_write(existing, path)


def claim_study_folder(out_dir: Path, record: StudyRecord, force: bool = False) -> StudyFolder:
    """Lock `out_dir` for the study of `record` (see the module docstring)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file, not a folder; give a new folder for the study")
    make_folder(out_dir)
    lock = _lock(out_dir)
    try:
        _remove_leftovers(out_dir)
        previous = _previous_study(out_dir)
        if previous is not None:
            _check_replace(out_dir, previous, record, force)
    except BaseException:
        lock.close()
        raise
    return StudyFolder(out_dir, lock)


@contextmanager
def holding(study_dir: Path, option: str | None = None) -> Iterator[None]:
    """The study folder's lock, held by a command that reads and rewrites a finished record
    (`report`, `decide`, `export`), or by a zoo run in its `--out`: refused at once while a run
    writes the folder, and no run starts while it is held. `option`: the command's option that
    names another folder, said in the refusal (the study commands have none). A folder that is
    not there is left to the command to refuse."""
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        yield
        return
    # rewritten in place (no option): a filesystem fault there names no --out
    with in_place(study_dir) if option is None else nullcontext():
        lock = _lock(study_dir, option)
        try:
            yield
        finally:
            lock.close()


def _lock(out_dir: Path, option: str | None = "--out") -> IO[str]:
    path = out_dir / LOCK_FILE
    try:
        lock = path.open("a+", encoding="utf-8")
    except OSError as e:
        message = filesystem_message(e, path)
        if message is None:
            raise
        raise FilesystemError(message) from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        words = lock.read().split()  # "pid N", as the holder wrote it
        holder = " ".join(words[-2:]) if words else "pid unknown"
        lock.close()
        other = f", or give another {option}" if option else ""
        raise UserError(
            f"{out_dir} is in use by another quantstudy run ({holder}); wait for it to "
            f"finish{other}"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def _remove_leftovers(out_dir: Path) -> None:
    """Temporary files of a run that was killed mid-write (no live run writes here: we lock)."""
    for folder in (out_dir, out_dir / CACHE_DIR):
        if folder.is_dir():
            for tmp in folder.glob(f".*{TMP_SUFFIX}"):
                tmp.unlink(missing_ok=True)


def _previous_study(out_dir: Path) -> dict[str, Any] | None:
    """The raw record already in `out_dir`, or None (absent, or unreadable: nothing to keep)."""
    path = out_dir / RECORD_FILE
    if not path.is_file():
        return None
    try:
        data = read_json(path, "study record", "record")
    except UserError as e:
        console.print(f"[yellow]{e}; the study replaces it[/yellow]", soft_wrap=True)
        return None
    return data if isinstance(data, dict) else None


def _check_replace(
    out_dir: Path, previous: dict[str, Any], record: StudyRecord, force: bool
) -> None:
    # a record this quantstudy cannot read (a newer one's) is kept unless replacing is asked for
    problem = schema_problem(out_dir / RECORD_FILE, previous)
    if problem is not None and not force:
        raise UserError(f"{problem}; give another --out, or pass --force to replace it")
    differences = (
        [problem]
        if problem
        else config_differences(previous.get("config") or {}, record.config.model_dump(mode="json"))
    )
    if not differences:
        return
    complete = previous.get("status") == "complete"
    said = "; ".join(differences[:3]) + (" ..." if len(differences) > 3 else "")
    if complete and not force:
        raise UserError(
            f"{out_dir} holds a complete study of another configuration ({said}); give "
            "another --out, or pass --force to replace it"
        )
    what = "complete" if complete else "partial"
    console.print(f"[yellow]replacing the {what} study in {out_dir} ({said})[/yellow]")
    for name in (RECORD_FILE, REPORT_FILE, *PLOT_FILES):
        (out_dir / name).unlink(missing_ok=True)


def config_differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`key: old -> new` for every config field that differs (paths compared resolved)."""
    keys = sorted((set(before) | set(now)) - NOT_COMPARED)
    return [
        f"{k}: {_show(before.get(k))} there, {_show(now.get(k))} now"
        for k in keys
        if not _same(before.get(k), now.get(k))
    ]


def _same(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and Path(a).exists() and Path(b).exists():
        return Path(a).resolve() == Path(b).resolve()
    return False


def _plain(x: Any) -> Any:
    """JSON-like form: enums as their value, tuples as lists, paths as strings."""
    if isinstance(x, tuple | list):
        return [_plain(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return getattr(x, "value", x)


def _show(x: Any) -> str:
    x = _plain(x)
    return "none" if x is None else str(x)
