"""The results section: one subsection per topic, each table next to the plot drawn from the
same record (`speed.py`, `quality.py`, `sequential.py` for a `--heldout auto` study,
`kernels.py`, `variants.py`, then `search.py` when the
record holds a search). The tables are declared in those modules (`tables.py`)."""

from __future__ import annotations

from quantstudy.record import StudyRecord
from quantstudy.report.plots import available_plots
from quantstudy.report.sections import kernels, quality, search, sequential, speed, variants
from quantstudy.report.sections.tables import TableSpec

TABLE_SPECS: list[TableSpec] = [
    *speed.TABLES,
    *quality.TABLES,
    *sequential.TABLES,
    *kernels.TABLES,
    *variants.TABLES,
    *search.TABLES,
]


def render_results(r: StudyRecord) -> list[str]:
    plots = {name for name, _ in available_plots(r)}
    return [
        "## Results",
        "",
        *speed.render_speed(r, plots),
        *quality.render_quality(r, plots),
        *sequential.render_sequential(r, plots),
        *kernels.render_kernels(r, plots),
        *variants.render_variants(r),
        *search.render_search(r, plots),
    ]
