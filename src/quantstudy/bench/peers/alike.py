"""Which rows share one peers record: the rows file, and adding rows to a record measured
alike.

A rows file names the models of one side-by-side table, each with its recipe and weights (the
study options of the command apply to every row); it is a model list (`study/model_list.py`,
whose reader also takes the older `rows:` and `model:` spellings)::

    models:
      - {name: vit_base_patch16_224, recipe: generic_linears, weights: random}
      - {name: resnet50, recipe: generic_dense_convs, weights: random}
      - {name: tf_efficientnet_lite0, weights: efficientnet-lite0}   # the family's recipe

A GPU machine that gives one command a few minutes measures one or two models a command: with
`--append` each command adds its rows to the same record, skipping the rows it holds (same
model, weights and recipe), and `peers-merge` makes one record of several. Rows are side by
side only if they were measured alike (pyperf: no comparison across environments): the same
GPU, driver, versions and lab switches (`SAME_PROVENANCE`), the same batches, rounds and
compile mode (`SAME_SETTINGS`), and the same code. The code is the same where two rows carry
the same hash of the sources that make a row's numbers (`ROW_SOURCES`, `study/sources.py`),
whatever commit each was measured at, so rows measured in several sessions, with commits
between them that change none of those files, form one table; each row keeps its own commit,
which the table names. A row without the hash (an older record) joins only rows of its own
commit. Anything unlike is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from quantstudy.bench.schema import PeersBench, PeersResult, Provenance, read_record
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.study.model_list import ModelEntry, read_model_list
from quantstudy.study.sources import ENGINE_SOURCES

# What must match for a row to join a record: provenance fields, the record's settings, and the
# code (`check_alike`): one commit, or one hash of `ROW_SOURCES`.
SAME_PROVENANCE = (
    "device", "gpu_name", "gpu_driver", "cuda", "cudnn", "torch", "triton", "timm", "python",
    "torchao", "lab_switches",
)  # fmt: skip
SAME_SETTINGS = ("batches", "rounds", "iters", "compile_mode", "quality_batch")
# The code that makes a row's numbers, under `quantstudy/`: what builds and times a study's
# engines (`study/sources.py`), and what a row adds: the images it reads and its split, the
# study's preparation (calibration), the scoring, torchao's engines and the row's own driver.
# Its table, rows file and merging do not change a number.
ROW_SOURCES = (
    *ENGINE_SOURCES, "data", "quality", "study/prepare.py", "bench/peers/run.py",
    "bench/peers/torchao.py", "bench/peers/configs.py",
)  # fmt: skip

Code = tuple[str | None, str | None]  # a row's commit and engine-sources hash (None: unknown)


def read_rows(path: Path) -> tuple[ModelEntry, ...]:
    """The rows of a rows file (module docstring); a mistake is a `UserError` naming its line."""
    return read_model_list(path, "rows file").entries


def row_config(base: StudyConfig, row: ModelEntry) -> StudyConfig:
    """The study config of one row: the command's options, with the row's model and the study
    options it gives (recipe, weights, strip_prefix)."""
    own = row.model_dump(exclude={"name"}, exclude_none=True)
    return StudyConfig(**base.model_dump(exclude_unset=True) | {"model": row.name} | own)


def existing_record(out: Path, append: bool) -> PeersBench | None:
    """The record at `out` that `--append` adds to (None: start one)."""
    if not append or not out.exists():
        return None
    record = read_record(out)
    if not isinstance(record, PeersBench):
        raise UserError(f"{out} is a {record.kind} record; --append adds rows to a peers record")
    return record


def row_code(record: PeersBench, row: PeersResult) -> Code:
    """The commit that measured `row` (an older row's: its record's) and its sources hash."""
    return row.git_commit or record.provenance.git_commit, row.engine_sources


def _short(text: str | None, n: int = 12) -> str:
    return "unknown" if text is None else text[:n]


class Sides(NamedTuple):
    """How a refusal names the rows held, the rows added and the fix: a run adding rows to its
    record (`RUN`), or `peers-merge` adding a file's rows to the first file's (`merging`)."""

    held: str
    new: str
    fix: str
    settings_fix: str  # for rows timed with other options


RUN = Sides(
    "the record's rows",
    "this run",
    "write another record (--out)",
    "give the same options or write another record (--out)",
)


def merging(first: Path, other: Path) -> Sides:
    fix = "merge only records measured alike"
    return Sides(f"{first}'s rows", str(other), fix, fix)


def check_code(held: list[Code], new: list[Code], sides: Sides = RUN) -> None:
    """Refuse rows of code `new` beside rows of code `held` (module docstring): two rows that
    both carry the hash must carry the same one; where either lacks it, the same commit."""
    for commit, sources in held:
        for other_commit, other_sources in new:
            if sources is not None and other_sources is not None:
                if sources != other_sources:
                    raise UserError(
                        f"{sides.held} were measured with engine sources {_short(sources)} "
                        f"(commit {_short(commit, 7)}), {sides.new}'s with "
                        f"{_short(other_sources)} (commit {_short(other_commit, 7)}): the code "
                        f"that makes the numbers differs; {sides.fix}"
                    )
            elif commit != other_commit:
                raise UserError(
                    f"{sides.held} were measured at commit {_short(commit, 7)}, {sides.new}'s "
                    f"at {_short(other_commit, 7)}, and a row without an engine-sources hash (an "
                    f"older record) joins only rows of its own commit; {sides.fix}"
                )


def check_alike(
    record: PeersBench,
    provenance: Provenance,
    settings: PeersBench,
    code: list[Code],
    sides: Sides = RUN,
) -> None:
    """Refuse to add rows measured unlike `record`'s (module docstring): rows measured under
    `provenance` and `settings`, of the code `code` (each row's commit and sources hash)."""
    for field in SAME_PROVENANCE:
        old, new = getattr(record.provenance, field), getattr(provenance, field)
        if old != new:
            raise UserError(
                f"{sides.held} were measured with {field} {old}, {sides.new} has {new}: "
                f"rows side by side must be measured alike; {sides.fix}"
            )
    for field in SAME_SETTINGS:
        old, new = getattr(record, field), getattr(settings, field)
        if old != new:
            raise UserError(
                f"{sides.held} were timed with {field} {old}, {sides.new} with {new}; "
                f"{sides.settings_fix}"
            )
    check_code([row_code(record, r) for r in record.results], code, sides)


def has_row(results: list[PeersResult], config: StudyConfig) -> bool:
    """Whether `results` hold a row of `config`'s model, weights and recipe (a user mistake in
    the recipe is left to the study's preparation, which names it)."""
    try:
        _, source = load_recipe(config.recipe or default_recipe_for(config.model))
    except UserError:
        return False
    return any(
        (r.model, r.weights, r.recipe) == (config.model, config.weights, source) for r in results
    )


def merge_records(paths: list[Path]) -> PeersBench:
    """One record of the rows of several, each measured alike (`check_alike` against the
    first): rows measured side by side on the GPUs of one host, one record each, become one
    table. A row held twice (same model, weights and recipe) is refused, not chosen between;
    a record still marked unfinished keeps its note in the merged one."""
    records = []
    for path in paths:
        record = read_record(path)
        if not isinstance(record, PeersBench):
            raise UserError(f"{path} is a {record.kind} record; --merge takes peers records")
        records.append(record)
    merged = records[0]
    for path, record in zip(paths[1:], records[1:], strict=True):
        code = [row_code(record, r) for r in record.results]
        check_alike(merged, record.provenance, record, code, merging(paths[0], path))
        held = {(r.model, r.weights, r.recipe) for r in merged.results}
        twice = next((r for r in record.results if (r.model, r.weights, r.recipe) in held), None)
        if twice is not None:
            raise UserError(
                f"{path}: {twice.model} ({twice.weights}, {twice.recipe}) is also in an earlier "
                "record; merge each row once"
            )
        # an older row (no commit of its own) joined only rows of its commit: the first's too
        merged = merged.model_copy(update={"results": [*merged.results, *record.results]})
    notes = [f"{p}: {r.unfinished}" for p, r in zip(paths, records, strict=True) if r.unfinished]
    return with_commits(merged.model_copy(update={"unfinished": "; ".join(notes) or None}))


def with_commits(record: PeersBench) -> PeersBench:
    """`record`, its provenance saying so where its rows were measured at several commits
    (`provenance.git_commit` is the first row's; each row names its own)."""
    commits = list(dict.fromkeys(row_code(record, r)[0] for r in record.results))
    if len(commits) < 2:
        return record
    sources = {r.engine_sources for r in record.results}
    code = (
        f"rows measured at commits {', '.join(_short(c, 7) for c in commits)}, with the same "
        f"engine sources {_short(next(iter(sources)))}; each row names its commit"
    )
    provenance = record.provenance.model_copy(update={"code": code})
    return record.model_copy(update={"provenance": provenance})
