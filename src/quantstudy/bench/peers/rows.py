"""The rows of a peers record: the rows file, and adding rows to a record measured alike.

A rows file names the models of one side-by-side table, each with its recipe and weights (the
study options of the command apply to every row)::

    rows:
      - {model: vit_base_patch16_224, recipe: generic_linears, weights: random}
      - {model: resnet50, recipe: generic_dense_convs, weights: random}
      - {model: tf_efficientnet_lite0, weights: efficientnet-lite0}   # the family's recipe

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

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantstudy.bench.schema import PeersBench, PeersResult, Provenance, read_record
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import StudyConfig
from quantstudy.record.readers import parse_yaml, read_text
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


class PeersRow(BaseModel):
    """One model of a rows file; a field left out takes the command's option."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    recipe: str | None = None
    weights: str | None = None


class RowsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: list[PeersRow] = Field(min_length=1)


def read_rows(path: Path) -> list[PeersRow]:
    """The rows of a rows file (module docstring); a malformed one is a `UserError`."""
    origin = f"rows file {path}"
    _, data = parse_yaml(read_text(path, "config", "rows file"), origin)
    try:
        rows = RowsFile.model_validate(data).rows
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "top level"
        raise UserError(f"{origin}: {where}: {first['msg']}") from None
    keys = [(r.model, r.weights, r.recipe) for r in rows]
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise UserError(f"{origin}: {repeated[0]} is listed twice alike; list each row once")
    from quantstudy.model.loading import check_listed_models  # imports torch: once it is valid

    check_listed_models([r.model for r in rows], lambda i: f"{origin}: rows.{i}.model")
    return rows


def row_config(base: StudyConfig, row: PeersRow) -> StudyConfig:
    """The study config of one row: the command's options, with the row's model, recipe and
    weights."""
    given = base.model_dump(exclude_unset=True) | {"model": row.model}
    given |= {k: v for k, v in (("recipe", row.recipe), ("weights", row.weights)) if v}
    return StudyConfig(**given)


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


def check_code(held: list[Code], new: list[Code]) -> None:
    """Refuse rows of code `new` beside rows of code `held` (module docstring): two rows that
    both carry the hash must carry the same one; where either lacks it, the same commit."""
    for commit, sources in held:
        for other_commit, other_sources in new:
            if sources is not None and other_sources is not None:
                if sources != other_sources:
                    raise UserError(
                        f"the record's rows were measured with engine sources {_short(sources)} "
                        f"(commit {_short(commit, 7)}), these with {_short(other_sources)} "
                        f"(commit {_short(other_commit, 7)}): the code that makes the numbers "
                        "differs; write another record (--out)"
                    )
            elif commit != other_commit:
                raise UserError(
                    f"the record's rows were measured at commit {_short(commit, 7)}, these at "
                    f"{_short(other_commit, 7)}, and a row without an engine-sources hash (an "
                    "older record) joins only rows of its own commit; write another record (--out)"
                )


def check_alike(
    record: PeersBench, provenance: Provenance, settings: PeersBench, code: list[Code]
) -> None:
    """Refuse to add rows measured unlike `record`'s (module docstring): rows measured under
    `provenance` and `settings`, of the code `code` (each row's commit and sources hash)."""
    for field in SAME_PROVENANCE:
        old, new = getattr(record.provenance, field), getattr(provenance, field)
        if old != new:
            raise UserError(
                f"the record's rows were measured with {field} {old}, this run has {new}: "
                "rows side by side must be measured alike; write another record (--out)"
            )
    for field in SAME_SETTINGS:
        old, new = getattr(record, field), getattr(settings, field)
        if old != new:
            raise UserError(
                f"the record's rows were timed with {field} {old}, this run with {new}: "
                "give the same options or write another record (--out)"
            )
    check_code([row_code(record, r) for r in record.results], code)


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
        check_alike(merged, record.provenance, record, code)
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
