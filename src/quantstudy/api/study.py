"""A study from Python: `run_study(StudyConfig(...))` and `load_study(folder)` give a `Study`.

The command line's `quantstudy run` does the same two steps (`study/commands.py`): the checks
that need no model (`study/guard.py: preflight`), then the study (`study/run.py: run_study`).
A `Study` is the typed record (`record/study.py: StudyRecord`) with its folder: the decision,
speed and quality sections as the report reads them, and the report's plots as matplotlib
figures (`report/plots.py: figures`), which a notebook shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantstudy.record import Decision, QualitySection, SpeedSection, StudyConfig, StudyRecord
from quantstudy.record.load import RECORD_FILE, load_record

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Study:
    """One study: its record and the folder that holds it. Truthy when its decision is *ship*.

    Example::

        study = quantstudy.load_study("studies/tf_efficientnet_lite0/generic_pointwise-seed0-cuda")
        print(study.decision.outcome, study.speed.batches[0].ratio.median)
        study.figures()["latency.png"]  # a matplotlib Figure
    """

    record: StudyRecord
    folder: Path

    @property
    def decision(self) -> Decision | None:
        """Ship, not ship or inconclusive, gate by gate; None for a study that stopped early."""
        return self.record.decision

    @property
    def speed(self) -> SpeedSection | None:
        """fp16 against FP8 per timed batch; None for a study run with `speed=False`."""
        return self.record.speed

    @property
    def quality(self) -> QualitySection | None:
        """Every engine against the fp32 reference; None for a speed-only study."""
        return self.record.quality

    @property
    def report(self) -> Path:
        """The Markdown report (`quantstudy report` renders it again from the record)."""
        from quantstudy.report.render import REPORT_FILE

        return self.folder / REPORT_FILE

    def figures(self) -> dict[str, Figure]:
        """The report's plots the record has data for, by file name (`latency.png`, `kl.png`,
        ...), as matplotlib figures drawn from the record alone."""
        from quantstudy.report.plots import figures

        return figures(self.record)

    def __bool__(self) -> bool:
        return self.record.decision is not None and self.record.decision.ship


def run_study(config: StudyConfig, *, force: bool = False) -> Study:
    """Run the study `config` describes, as `quantstudy run` does; the finished `Study`.

    Example::

        config = quantstudy.StudyConfig(model="tf_efficientnet_lite0", data="images/val")
        study = quantstudy.run_study(config)
        print(study.decision.outcome)

    `force`: replace a finished study of another configuration in the same folder (`--force`).
    Progress goes to the console, or to a notebook's output where one runs (rich). A user
    mistake raises `UserError` with the command line's one-line message."""
    from quantstudy.study.guard import preflight
    from quantstudy.study.run import run_study as run

    preflight(config)  # what needs no model is refused before torch is imported, as `run` does
    _, report = run(config, force=force)
    return load_study(report.parent)  # the record as written: sealed, with its digest


def load_study(study_dir: str | Path) -> Study:
    """The study a `quantstudy run` (or `run_study`) wrote into `study_dir`.

    Example::

        study = quantstudy.load_study("studies/test_vit/generic_default-seed0-cpu")
        print(bool(study), study.record.status)

    A folder without a record, a record of a schema this quantstudy does not read, or one that
    does not validate raises `UserError`, as `quantstudy report` refuses it. A partial study
    (stopped before its decision) loads: its `decision` is None."""
    folder = Path(study_dir)
    return Study(load_record(folder / RECORD_FILE), folder)
