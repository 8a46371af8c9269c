"""The shipped tuning table: tuned choices committed as package data, so a study on a listed GPU
launches them without tuning, where a bare machine would tune every launch cold.

One JSON file per GPU name in `tables/` (`table_file`): {"format": FORMAT, "gpu": name,
"triton": version, "entries": [{"kernel", "source", "launch", "dtypes", "config", "words"}]}.
An entry holds for one launch of one kernel (`tuning.Tuned.name`): `launch` is the autotuner's
key (names to values) and `dtypes` its arguments' dtypes, as `choices.launch_of` reads them;
`source` is `kernel_source.kernel_source_sha` of the kernel it was tuned for; `config` the
winning config as Triton writes it (`str(config)`), `words` the same for a reader.

A launch takes an entry only on the table's GPU, under the table's Triton version, with the
kernel's source hash today, and where today's prune still keeps the entry's config (a tile the
prune drops might not write the same bits, `tuning.py` point 4); anything else misses and the
launch tunes as before, into the machine's own store (`choices.py`). A kernel edit so stales
only that kernel's entries; a reworded docstring none. A table that cannot be read is no table.

`build_tables` makes the tables from a machine's store (`quantstudy bench tuning-table`),
keeping an older table's entries of the same GPU and Triton unless the store has the launch,
and dropping every entry of a kernel source other than today's.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantstudy.env import machine
from quantstudy.quant.kernels import choices
from quantstudy.quant.kernels.kernel_source import kernel_source_sha
from quantstudy.quant.kernels.tiles import Config, config_words
from quantstudy.record.io import write_json_atomic

FORMAT = 1
TABLES = Path(__file__).resolve().parent / "tables"
ENTRY_FIELDS = ("kernel", "source", "launch", "dtypes", "config")

_FOUND: dict[str, int | None] = {}  # a launch's store key -> the table's config index, or None


def slug(gpu: str) -> str:
    """The table's file stem for a GPU name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def table_file(gpu: str, folder: Path | None = None) -> Path:
    return (folder or TABLES) / f"{slug(gpu)}.json"


def entry_key(entry: dict[str, Any]) -> str:
    """What an entry is found by: kernel, source, launch values and dtypes."""
    return json.dumps([entry[f] for f in ENTRY_FIELDS[:-1]], sort_keys=True)


def forget() -> None:
    """Drop this process's lookups and tables read (a test's new tables, a new process)."""
    _FOUND.clear()
    _entries.cache_clear()


def read_table(path: Path) -> dict[str, Any] | None:
    """The table at `path`; None where it is absent, damaged or of another format."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    entries = data.get("entries")
    if not isinstance(entries, list):
        return None
    kept = [e for e in entries if isinstance(e, dict) and all(f in e for f in ENTRY_FIELDS)]
    return data | {"entries": kept}


@functools.cache
def _entries(gpu: str, folder: Path) -> dict[str, str]:
    """The config of each entry of `gpu`'s table under this Triton, by `entry_key`; none where
    the table is missing, unreadable, of another GPU or of another Triton."""
    data = read_table(table_file(gpu, folder))
    if data is None or data.get("gpu") != gpu or data.get("triton") != machine.triton_version():
        return {}
    return {entry_key(e): str(e["config"]) for e in data["entries"]}


def lookup(tuned: Any, key: str, args: tuple[Any, ...], meta: dict[str, Any]) -> int | None:
    """The index in `tuned.configs` of the table's config for this launch (`key`: its store
    key, which memoizes the answer in this process); None: not in the table, or not valid
    here (module docstring)."""
    if key not in _FOUND:
        _FOUND[key] = _find(tuned, args, meta)
    return _FOUND[key]


def _find(tuned: Any, args: tuple[Any, ...], meta: dict[str, Any]) -> int | None:
    launch = choices.launch_of(tuned, args, meta)
    entries = _entries(choices.device_name(launch.device), TABLES)
    if not entries:  # no table here: the kernel's source is not even hashed
        return None
    source = kernel_source_sha(tuned.kernel)
    wanted = {"kernel": tuned.name, "source": source, "launch": launch.values}
    config = entries.get(entry_key(wanted | {"dtypes": launch.dtypes}))
    if config is None:
        return None
    named = dict(zip(tuned.arg_names, args, strict=False))
    for c in tuned.prune(tuned.configs, named, **meta):
        if str(c) == config:
            return int(tuned.configs.index(c))
    return None


def about(tuned: Any, args: tuple[Any, ...], meta: dict[str, Any], best: Config) -> dict[str, Any]:
    """What a store entry keeps beside its index so that a table can be built from it."""
    launch = choices.launch_of(tuned, args, meta)
    return {
        "kernel": tuned.name,
        "source": kernel_source_sha(tuned.kernel),
        "launch": launch.values,
        "dtypes": launch.dtypes,
        "chosen": str(best),  # the index beside it means a config only under one config list
        "words": config_words(best),
        "gpu": choices.device_name(launch.device),
        "triton": machine.triton_version(),
    }


@dataclass(frozen=True)
class Built:
    """One table written: its file, its entries, and of those how many came from the store."""

    path: Path
    gpu: str
    entries: int
    from_store: int


def build_tables(
    store: Path,
    out: Path,
    current: dict[str, str],
    triton_version: str | None = None,
) -> tuple[list[Built], dict[str, int]]:
    """One table per GPU in `store` (a `choices.py` file) into the folder `out`, for the
    kernels of `current` (name -> today's source hash) under `triton_version` (default: this
    process's, `env/machine.py`); an existing
    table of the same GPU and Triton keeps its entries the store does not replace. Returns the
    tables written and, by reason, the store entries left out."""
    version = triton_version or machine.triton_version() or ""
    skipped: dict[str, int] = {}
    by_gpu: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in choices.read_store(store).values():
        reason = _left_out(entry, current, version)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        row = {f: entry[f] for f in ENTRY_FIELDS[:-1]}
        row |= {"config": entry["chosen"], "words": entry["words"]}
        by_gpu.setdefault(entry["gpu"], {})[entry_key(row)] = row
    built = []
    for gpu, rows in sorted(by_gpu.items()):
        path = table_file(gpu, out)
        older = read_table(path)
        kept: dict[str, dict[str, Any]] = {}
        if older is not None and older.get("gpu") == gpu and older.get("triton") == version:
            kept = {
                entry_key(e): e for e in older["entries"] if current.get(e["kernel"]) == e["source"]
            }
        merged = kept | rows
        ordered = sorted(merged.values(), key=entry_key)
        out.mkdir(parents=True, exist_ok=True)
        table = {"format": FORMAT, "gpu": gpu, "triton": version, "entries": ordered}
        write_json_atomic(path, table)
        built.append(Built(path, gpu, len(ordered), len(rows)))
    return built, skipped


def _left_out(entry: Any, current: dict[str, str], triton_version: str) -> str | None:
    """Why a store entry does not go into a table; None: it does."""
    needs = (*ENTRY_FIELDS[:-1], "chosen", "words", "gpu", "triton")
    if not isinstance(entry, dict) or not all(f in entry for f in needs):
        return "stored without what a table needs (before tables)"
    if entry.get("triton") != triton_version:
        return f"another Triton than {triton_version}"
    if entry["kernel"] not in current:
        return "a kernel with no table"
    if entry["source"] != current[entry["kernel"]]:
        return "tuned for another kernel source"
    if entry["gpu"] in ("cpu", "meta"):
        return "not tuned on a GPU"
    return None
