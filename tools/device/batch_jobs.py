"""The jobs file of `batch.py`: a YAML list of jobs, each checked, and `--only`'s choice.

    - name: zoo-1                     # letters, digits, '.', '_', '-' (a returned file's name)
      run: quantstudy zoo ... --out $OUT/zoo --shard 1/8     # a bash command
      minutes: 7                      # expected; with the budget it decides what starts
      after: [gpu-kernels]            # optional: starts once these ended (not if none ran)
      skip: [.cache]                  # optional: names left out of its pack, at any depth

A mistake is one `JobsError` line that says how to fix it.
"""

from __future__ import annotations

import graphlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # the names a returned file may have
KEYS = {"name", "run", "minutes", "after", "skip"}


class JobsError(Exception):
    """A mistake in the jobs file or the options: one line that says how to fix it."""


@dataclass(frozen=True)
class Spec:
    name: str
    run: str
    minutes: float
    after: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()


def read_jobs(path: Path) -> list[Spec]:
    """The jobs of `path` (module docstring), each checked; a mistake is one `JobsError`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise JobsError(f"cannot read the jobs file {path}: {e.strerror}; give its path") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise JobsError(f"{path} is not YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, list) or not data:
        raise JobsError(
            f"{path}: the top level must be a list of jobs (- name: N, run: CMD, minutes: M)"
        )
    specs = [_spec(path, i, item) for i, item in enumerate(data, 1)]
    names = [s.name for s in specs]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise JobsError(f"{path}: job {twice} is listed twice; give each job its own name")
    for s in specs:
        unknown = [a for a in s.after if a not in names]
        if unknown:
            raise JobsError(
                f"{path}: job {s.name} waits for {unknown[0]}, which is no job "
                "of the file; name a job listed there"
            )
    try:
        graphlib.TopologicalSorter({s.name: s.after for s in specs}).prepare()
    except graphlib.CycleError as e:
        circle = " -> ".join(e.args[1])
        raise JobsError(
            f"{path}: the jobs wait for each other in a circle ({circle}); "
            "remove one of those `after`s"
        ) from None
    return specs


def _spec(path: Path, i: int, item: object) -> Spec:
    where = f"{path}: job {i}"
    if not isinstance(item, dict):
        raise JobsError(f"{where} is not a mapping; write it as - name: N, run: CMD, minutes: M")
    extra = sorted(set(item) - KEYS, key=str)
    missing = sorted({"name", "run", "minutes"} - set(item))
    if extra or missing:
        what = f"has no {missing[0]}" if missing else f"has an unknown key {extra[0]!r}"
        raise JobsError(f"{where} {what}; a job's keys are {', '.join(sorted(KEYS))}")
    name, run, minutes = item["name"], item["run"], item["minutes"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise JobsError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-'")
    if not isinstance(run, str) or not run.strip():
        raise JobsError(f"{where} ({name}): run must be a shell command")
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or minutes <= 0:
        raise JobsError(f"{where} ({name}): minutes must be a number above 0, not {minutes!r}")
    lists = {}
    for key in ("after", "skip"):
        value = item.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise JobsError(f"{where} ({name}): {key} must be a list of names")
        lists[key] = tuple(value)
    if name in lists["after"]:
        raise JobsError(f"{where} ({name}) waits for itself; remove it from its after")
    return Spec(name, run, float(minutes), lists["after"], lists["skip"])


def select(specs: list[Spec], only: str | None) -> list[Spec]:
    """The jobs `--only` names; an `after` on a job left out is dropped (it is not waited for:
    its output, if any, is from another call)."""
    if only is None:
        return specs
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    names = [s.name for s in specs]
    unknown = [n for n in wanted if n not in names]
    if unknown or not wanted:
        raise JobsError(
            f"--only {only}: {unknown[0] if unknown else 'no name'} is no job of "
            f"the file; the jobs are {', '.join(names)}"
        )
    chosen = [s for s in specs if s.name in wanted]
    return [
        Spec(s.name, s.run, s.minutes, tuple(a for a in s.after if a in wanted), s.skip)
        for s in chosen
    ]
