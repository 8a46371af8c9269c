"""A model whose recipe selects no layer still gets an answer: "no layer where FP8 pays", with
the x of a recipe that does select layers of it, never a failure.

Its study exits with `EXIT_NOTHING_SELECTED` (`study/checks.py`), so the zoo runs the model again
with the next of the wider generic recipes (`recipe/builtin.py: FALLBACKS` after the default):
`generic_dense_convs` puts the dense kxk convs that the defaults keep in fp16 into FP8,
`generic_all` every conv and linear layer. The row keeps the refused
recipe's name, and says which recipe its figures are of (`x_recipe`) and which layers that
recipe ran in FP8 (from the fallback study's own record). Until its fallback has run, the row is
`pending` with a note, never `failed`: the refusal is half an answer.

The fallbacks run in rounds after the whole list (`zoo/run.py: _run_with_answers`), not as soon
as a refusal is known: an executor takes a fixed list of jobs (the local one's workers end when
its queue is empty, the Ray one submits every job up front), so queueing a job mid-run would
change both executors and their protocol. A refusal costs seconds (the study stops before any
engine is built), so the round after the list holds only the few refused models.
"""

from __future__ import annotations

from pathlib import Path

from quantstudy.recipe.builtin import FALLBACKS as GENERIC
from quantstudy.recipe.builtin import default_recipe_for
from quantstudy.record.errors import EXIT_NOTHING_SELECTED, UserError
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import RowStatus
from quantstudy.sweep.events import Job
from quantstudy.sweep.grid import GridPoint
from quantstudy.sweep.point import PointStatus, read_status
from quantstudy.sweep.progress import SweepProgress
from quantstudy.zoo.board import ZooRow

# The recipes a refused model runs under in turn: the generic ones wider than the default (a
# model whose default selects nothing gains nothing from the default again).
FALLBACKS = GENERIC[1:]
# A fallback in one of these states has not answered yet: the model's row takes its status
# (not `failed`), with a note of which fallback is to answer.
WAITING = (RowStatus.PENDING, RowStatus.INTERRUPTED)


def refused(folder: Path) -> bool:
    """The study in `folder` ended because its recipe selects no layer (a finished answer)."""
    status = read_status(folder)
    return status is not None and status.returncode == EXIT_NOTHING_SELECTED


def fallback_job(job: Job, recipe: str) -> Job:
    """`job`'s model under the built-in `recipe`."""
    point = GridPoint(config=job.point.config.replace(recipe=recipe))
    return Job(point, point.folder_name)


def chain(job: Job) -> list[Job]:
    """`job`, then its model under each of `FALLBACKS` it does not already run."""
    own = job.point.config.recipe
    return [job, *(fallback_job(job, r) for r in FALLBACKS if r != own)]


def next_fallback(job: Job) -> str | None:
    """The recipe the zoo runs `job`'s model under when `job` is refused: the first of
    `FALLBACKS` after its own recipe; None when none is left."""
    own = job.point.config.recipe
    later = FALLBACKS[FALLBACKS.index(own) + 1 :] if own in FALLBACKS else FALLBACKS
    return later[0] if later else None


class AnswerProgress(SweepProgress):
    """The sweep's progress lines, with a refusal said as the half answer it is: its fallback
    runs next (`_run_with_answers`), so it is neither FAILED nor counted as failed."""

    def said(self, job: Job, status: PointStatus) -> tuple[str, str]:
        after = next_fallback(job)
        if status.returncode != EXIT_NOTHING_SELECTED or after is None:
            return super().said(job, status)
        config = job.point.config
        own = config.recipe or default_recipe_for(config.model)
        wall = f"{status.wall_s:.1f} s" if status.wall_s is not None else "-"
        return "no layer", (
            f"[cyan]no layer[/cyan] {job.point.label} ({wall}): {own} selects no layer of "
            f"{config.model}; its fallback {after} runs after the list"
        )


def next_refused(job: Job, out: Path) -> Job | None:
    """The fallback to run next for `job`: the first of its chain not yet run, after a chain
    of refusals; None when its answer is in (or it failed for another reason)."""
    for step, after in zip(chain(job), chain(job)[1:], strict=False):
        if not refused(out / step.folder):
            return None
        if read_status(out / after.folder) is None:
            return after
    return None


def _kinds(folder: Path) -> str:
    """The layers the fallback's FP8 engine ran, by kind, from its record's recipe counts."""
    try:
        recipe = load_record(folder / RECORD_FILE).recipe
    except UserError:
        return "its layers"
    counts = recipe.counts if recipe is not None else {}
    kinds = [f"{n} {k.removeprefix('selected.').replace('.', ' ')}" for k, n in counts.items()]
    return ", ".join(k for k in kinds if not k[0] == "0" and "excluded" not in k) or "its layers"


def answered(out: Path, rows: list[tuple[Job, ZooRow]]) -> ZooRow:
    """The model's row from its chain's rows (`chain` order, each read from its folder in
    `out`): the first study's, unless its recipe was refused: then the fallback's answer, or,
    while that fallback has not run (or was stopped), the first row as `pending` (`interrupted`)
    with a note of what is to answer it; `failed` only when the fallback itself failed."""
    first_job, first = rows[0]
    own = first_job.point.config.recipe or default_recipe_for(first_job.point.config.model)
    for (job, row), (before_job, _) in zip(rows[1:], rows, strict=False):
        if not refused(out / before_job.folder):
            break
        recipe = job.point.config.recipe
        if row.status == RowStatus.COMPLETE:
            answer = (
                f"no layer where FP8 pays under {own}: it keeps every conv and linear layer in "
                f"fp16; x of {recipe}, which runs {_kinds(out / job.folder)} in FP8"
            )
            update = {"status": RowStatus.NO_LAYER, "recipe": own, "x_recipe": recipe}
            return row.model_copy(update=update | {"answer": answer})
        if row.status in WAITING:  # no answer yet, and no failure either
            said = "runs after the list" if row.status == RowStatus.PENDING else "was stopped"
            note = f"{own} selects no layer; its fallback {recipe} {said}"
            return first.model_copy(update={"status": row.status, "error": None, "answer": note})
        if not refused(out / job.folder):
            why = row.error or str(row.status)
            return first.model_copy(update={"error": f"{own} selects no layer; {recipe}: {why}"})
    return first
