"""The rows of a peers record: the rows file, and adding rows to a record measured alike.

A rows file names the models of one side-by-side table, each with its recipe and weights (the
study options of the command apply to every row)::

    rows:
      - {model: vit_base_patch16_224, recipe: generic_linears, weights: random}
      - {model: resnet50, recipe: generic_dense_convs, weights: random}
      - {model: tf_efficientnet_lite0, weights: efficientnet-lite0}   # the family's recipe

A GPU machine that gives one command a few minutes measures one or two models a command: with
`--append` each command adds its rows to the same record, skipping the rows it holds (same
model, weights and recipe). Rows
are side by side only if they were measured alike, so a record takes a row only from the same
commit, GPU, driver and versions, at the same batches, rounds and compile mode (pyperf: no
comparison across environments); anything else is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantstudy.bench.schema import PeersBench, PeersResult, Provenance, read_record
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import StudyConfig
from quantstudy.record.readers import parse_yaml, read_text

# What must match for a row to join a record: provenance fields, then the record's settings.
SAME_PROVENANCE = (
    "git_commit", "device", "gpu_name", "gpu_driver", "cuda", "cudnn", "torch", "triton",
    "timm", "python", "torchao",
)  # fmt: skip
SAME_SETTINGS = ("batches", "rounds", "iters", "compile_mode", "quality_batch")


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


def check_alike(record: PeersBench, provenance: Provenance, settings: PeersBench) -> None:
    """Refuse to add rows measured unlike `record`'s (module docstring)."""
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
    first, results = records[0], list(records[0].results)
    for path, record in zip(paths[1:], records[1:], strict=True):
        check_alike(first, record.provenance, record)
        held = {(r.model, r.weights, r.recipe) for r in results}
        twice = next((r for r in record.results if (r.model, r.weights, r.recipe) in held), None)
        if twice is not None:
            raise UserError(
                f"{path}: {twice.model} ({twice.weights}, {twice.recipe}) is also in an earlier "
                "record; merge each row once"
            )
        results += record.results
    notes = [f"{p}: {r.unfinished}" for p, r in zip(paths, records, strict=True) if r.unfinished]
    return first.model_copy(update={"results": results, "unfinished": "; ".join(notes) or None})
